//! The exec helper (`crius-exec-helper`, or the shim binary itself where that is not
//! installed beside it), run from a sealed in-memory copy, as a small `runc exec --detach`. It joins the container's cgroups and namespaces (through a pidfd of
//! its init), forks the process in its PID namespace, becomes its user with its
//! capabilities, and execs the program; it writes the process's pid to the pid file and
//! its failures to runc's log for this bundle, in runc's words.
//!
//! Why a copy in memory: the helper's child enters the container before its exec, and a
//! program there that names `/proc/self/exe` as its interpreter would run the helper's own
//! binary again, inside the container, where its other processes could write to it through
//! `/proc/<pid>/exe`. The copy is sealed against writes and is nothing on the host's disk.
//! The helper is not dumpable either, so the container cannot trace it or read its memory.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use nix::sched::CloneFlags;
use nix::unistd::ForkResult;

use super::cgroups::{InitCgroups, init_cgroups};
use super::child::EXECS;
use super::spec::{CapSets, ExecProcess};

/// The argument that runs the shim binary as the exec helper.
pub const ACTION: &str = "exec-helper";
/// The helper's descriptor of a pidfd of the container's init.
pub const INIT_PIDFD: RawFd = 3;
/// The most of a process spec or a /proc file the helper reads.
const MAX_FILE: u64 = 16 << 20;
/// runc's words for an exec into a container whose init is gone.
const STOPPED: &str = "exec failed: cannot exec in a stopped container";
/// How the helper's refusals start, before it has touched the container: the shim then
/// has runc run the exec.
pub const DECLINED: &str = "the shim's exec declined: ";
/// The most of the child's failure report the helper reads.
const MAX_REPORT: u64 = 64 * 1024;

/// The build of the helper's sources (build.rs): the shim and the helper it runs must be
/// of one build, since the command line is theirs alone.
pub const BUILD: &str = env!("CRIUS_EXEC_HELPER_BUILD");

/// What the helper is told on its command line.
#[derive(Debug, PartialEq, Eq)]
pub struct HelperArgs {
    pub process: PathBuf,
    pub pid_file: PathBuf,
    pub log: PathBuf,
    /// The session keyring to join (runc's `_ses.<id>`); empty: keep none of its own.
    pub keyring: String,
}

impl HelperArgs {
    /// The command line: the action, the build and the log first, in every build, so that
    /// a helper of another build can still say where it declines.
    #[allow(dead_code)] // crius-exec-helper only reads its command line.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            ACTION.into(),
            BUILD.into(),
            self.log.clone().into(),
            self.process.clone().into(),
            self.pid_file.clone().into(),
            self.keyring.clone().into(),
        ]
    }

    pub fn parse(args: &[String]) -> Option<Self> {
        match args {
            [action, build, log, process, pid_file, keyring]
                if action == ACTION && build == BUILD =>
            {
                Some(Self {
                    process: process.into(),
                    pid_file: pid_file.into(),
                    log: log.into(),
                    keyring: keyring.clone(),
                })
            }
            _ => None,
        }
    }
}

/// What a helper of another build than the shim answers (it declines: runc runs the exec).
pub const OTHER_BUILD: &str = "the exec helper is of another build than the shim";

/// Runs the helper and exits: 0 when the process runs, 1 when it could not be started (the
/// reason in the log).
pub fn run(args: &[String]) -> ! {
    if args.first().map(String::as_str) != Some(ACTION) {
        eprintln!("crius-exec-helper: run by crius's shim only");
        std::process::exit(2);
    }
    let log = args.get(2).and_then(|path| {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .ok()
    });
    let outcome = match HelperArgs::parse(args) {
        Some(args) => execute(&args),
        None if args.get(1).map(String::as_str) != Some(BUILD) => {
            Err(format!("{DECLINED}{OTHER_BUILD}"))
        }
        None => Err("exec failed: the exec helper's command line is malformed".to_string()),
    };
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(message) => {
            if let Some(mut log) = log {
                let entry = serde_json::json!({"level": "error", "msg": message});
                let _ = writeln!(log, "{entry}");
            }
            std::process::exit(1)
        }
    }
}

fn execute(args: &HelperArgs) -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("exec failed: prctl: {e}"))?;
    let process = ExecProcess::parse(&read_bounded(&args.process)?)?;
    if let Some(why) = process.needs_runc() {
        return Err(format!("{DECLINED}{why}"));
    }
    let caps = process
        .cap_sets()
        .ok_or("exec failed: unknown capability")?;
    let last_cap = last_capability()?;
    // Capabilities this kernel does not have are left out, as runc does.
    let caps = caps.known_to(last_cap);
    // SAFETY: the shim hands the helper this descriptor, and nothing else owns it.
    let init = unsafe { OwnedFd::from_raw_fd(INIT_PIDFD) };
    let init_pid = pidfd_pid(INIT_PIDFD)?;
    let cgroups = init_cgroups(
        &String::from_utf8_lossy(&read_bounded(format!("/proc/{init_pid}/cgroup"))?),
        &String::from_utf8_lossy(&read_bounded("/proc/self/mountinfo")?),
    )
    .map_err(|e| format!("{DECLINED}{e}"))?;
    // The init read above is the container's, not a process that took its pid since.
    ensure_alive(&init)?;
    if cgroups.frozen() {
        return Err(
            "exec failed: cannot exec in a paused container (use --ignore-paused to override)"
                .to_string(),
        );
    }
    join_cgroups(&cgroups)?;
    if let Some(adj) = process.oom_score_adj {
        std::fs::write("/proc/self/oom_score_adj", adj.to_string())
            .map_err(|e| format!("exec failed: set oom_score_adj: {e}"))?;
    }
    let pid_file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&args.pid_file)
        .map_err(|e| format!("exec failed: open {}: {e}", args.pid_file.display()))?;
    join_namespaces(&init)?;
    drop(init);
    join_keyring(&args.keyring)?;
    fork_process(&process, caps, last_cap, pid_file)
}

/// Forks the process (in the container's PID namespace now), records its pid, and waits
/// for its exec: the report pipe closes on it, or carries why it failed.
fn fork_process(
    process: &ExecProcess,
    caps: CapSets,
    last_cap: u32,
    mut pid_file: File,
) -> Result<(), String> {
    let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("exec failed: pipe: {e}"))?;
    // SAFETY: the helper has one thread, so the child may do anything the parent could.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(format!("exec failed: fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(report_read);
            drop(pid_file);
            let why = super::child::become_process(process, caps, last_cap, &report_write);
            let mut report = File::from(report_write);
            let _ = report.write_all(why.as_bytes());
            // SAFETY: ends the child without running the parent's exit handlers twice.
            unsafe { libc::_exit(127) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(report_write);
            if let Err(e) = pid_file.write_all(child.as_raw().to_string().as_bytes()) {
                // Untracked, the process must not run.
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(format!("exec failed: write the pid file: {e}"));
            }
            let mut report = Vec::new();
            let _ = File::from(report_read)
                .take(MAX_REPORT)
                .read_to_end(&mut report);
            let why = match report.split_first() {
                Some((&EXECS, [])) => return Ok(()),
                Some((&EXECS, why)) => String::from_utf8_lossy(why).into_owned(),
                Some(_) => String::from_utf8_lossy(&report).into_owned(),
                None => "the process ended before its exec".to_string(),
            };
            let _ = nix::sys::wait::waitpid(child, None);
            Err(format!(
                "exec failed: unable to start container process: {why}"
            ))
        }
    }
}

fn read_bounded(path: impl AsRef<std::path::Path>) -> Result<Vec<u8>, String> {
    let path = path.as_ref();
    let mut text = Vec::new();
    File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_end(&mut text))
        .map_err(|e| format!("exec failed: read {}: {e}", path.display()))?;
    Ok(text)
}

/// The pid a pidfd refers to, from its fdinfo.
fn pidfd_pid(fd: RawFd) -> Result<i32, String> {
    let info = read_bounded(format!("/proc/self/fdinfo/{fd}"))?;
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|pid: &i32| *pid > 0)
        .ok_or_else(|| STOPPED.to_string())
}

fn ensure_alive(init: &OwnedFd) -> Result<(), String> {
    // SAFETY: signal 0 through a pidfd only checks that the process is there.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            init.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if sent != 0 {
        return Err(STOPPED.to_string());
    }
    Ok(())
}

/// Moves the helper into the init's cgroups; its child is born there.
fn join_cgroups(cgroups: &InitCgroups) -> Result<(), String> {
    for dir in &cgroups.dirs {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, "0")
            .map_err(|e| format!("exec failed: join {}: {e}", procs.display()))?;
    }
    Ok(())
}

/// The highest capability number this kernel knows, read on the host's /proc.
fn last_capability() -> Result<u32, String> {
    let text = read_bounded("/proc/sys/kernel/cap_last_cap")?;
    String::from_utf8_lossy(&text)
        .trim()
        .parse()
        .map_err(|e| format!("exec failed: cap_last_cap: {e}"))
}

/// Joins every namespace of the init at once (its mount namespace sets the root to the
/// container's). A namespace the container shares with the host is the helper's already.
fn join_namespaces(init: &OwnedFd) -> Result<(), String> {
    let all = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWCGROUP;
    nix::sched::setns(init, all).map_err(|e| match e {
        // An init that exited (a zombie still) has no namespaces left to join.
        nix::errno::Errno::ESRCH => STOPPED.to_string(),
        e => format!("exec failed: join the namespaces: {e}"),
    })
}

/// Joins the container's session keyring, as runc does, so the process does not get the
/// shim's. A kernel without keyrings is no failure.
fn join_keyring(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Ok(());
    }
    let name = std::ffi::CString::new(name).map_err(|_| "exec failed: keyring name")?;
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    // SAFETY: keyctl reads a NUL-terminated name.
    let joined =
        unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, name.as_ptr()) };
    let error = std::io::Error::last_os_error();
    if joined < 0 && error.raw_os_error() != Some(libc::ENOSYS) {
        return Err(format!("exec failed: join the session keyring: {error}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_reads_back() {
        let args = HelperArgs {
            process: "/b/exec-1.json".into(),
            pid_file: "/b/exec-1.pid".into(),
            log: "/b/log.json".into(),
            keyring: "_ses.c1".into(),
        };
        let line: Vec<String> = args
            .to_args()
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect();
        assert_eq!(HelperArgs::parse(&line), Some(args));
        assert_eq!(line[2], "/b/log.json", "the log stays third in every build");
        assert_eq!(HelperArgs::parse(&line[..4]), None);
        assert_eq!(HelperArgs::parse(&["pause".to_string()]), None);
        let mut other_build = line.clone();
        other_build[1] = "0123456789abcdef".to_string();
        assert_eq!(HelperArgs::parse(&other_build), None);
    }
}
