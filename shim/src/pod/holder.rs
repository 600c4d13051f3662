//! The pod's holder: the one process that keeps a pod's namespaces when containerd drives
//! the pod through the sandbox API (there is no pause container). A child of the shim
//! joins the pod's user namespace (if it has one) and network namespace, makes the pod's
//! PID, IPC and UTS namespaces (owned by that user namespace), names the pod and sets its
//! sysctls, then forks the pod's PID 1, which execs the shim binary again as `pause`: it
//! reaps what is reparented to it and ends on SIGTERM or SIGINT.
//!
//! The holder is every container's PID 1 when the pod shares its PID namespace, so what it
//! holds is in reach of any of them that may trace it (`/proc/1/root`, `/proc/1/fd`,
//! ptrace). Before the exec it is shut in: its own mount namespace with an empty read-only
//! root, `/dev/null` for its stdio, no capabilities (none it could regain by exec either)
//! and no new privileges; after it, it is not dumpable.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};

use crate::error::ShimError;

/// The argument that runs the shim binary as a pod's holder.
pub const PAUSE_ACTION: &str = "pause";
const STACK_SIZE: usize = 256 * 1024;

/// The namespaces a pod's holder gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// The network namespace to join (containerd's CRI made it and ran CNI in it); None:
    /// the host's.
    pub netns: Option<PathBuf>,
    /// A PID namespace of the pod's own, the holder its PID 1 (false: the host's).
    pub pid: bool,
    pub ipc: bool,
    /// A UTS namespace with the pod's hostname (false with the host's network).
    pub uts: bool,
    pub hostname: String,
    /// Join the user namespace containerd's CRI made the pod's network namespace in.
    pub userns: bool,
    /// The pod's sysctls, set in its namespaces: (path below /proc/sys, value).
    pub sysctls: Vec<(String, String)>,
}

impl Namespaces {
    fn clone_flags(&self) -> CloneFlags {
        let mut flags = CloneFlags::empty();
        if self.pid {
            flags |= CloneFlags::CLONE_NEWPID;
        }
        if self.ipc {
            flags |= CloneFlags::CLONE_NEWIPC;
        }
        if self.uts {
            flags |= CloneFlags::CLONE_NEWUTS;
        }
        flags
    }
}

/// `ioctl(NS_GET_USERNS)`: the user namespace that owns a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;
/// A report record from the child: its kind (a failed step, or [`PID_RECORD`]) and a value.
const RECORD: usize = 5;
const PID_RECORD: u8 = 0xff;

/// What the child reports through the pipe when a step fails: the step and errno.
fn failure(step: u8) -> [u8; RECORD] {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    record(step, errno)
}

fn record(kind: u8, value: i32) -> [u8; RECORD] {
    let v = value.to_le_bytes();
    [kind, v[0], v[1], v[2], v[3]]
}

/// The failed step's words. crius answers INVALID_ARGUMENT for "set the hostname" and "set
/// the pod's sysctls" (the kernel refused the pod's own values): keep those words.
fn step_name(step: u8) -> &'static str {
    match step {
        1 => "join the network namespace",
        2 => "set the hostname",
        3 => "change to /",
        5 => "set the pod's sysctls",
        6 => "join the pod's user namespace",
        7 => "make the pod's namespaces",
        8 => "fork the pod's PID 1",
        9 => "give the holder an empty read-only root",
        10 => "drop the holder's privileges",
        11 => "point the holder's stdio at /dev/null",
        12 => "join the pod's cgroup",
        _ => "exec the shim as the holder",
    }
}

/// Everything the child needs, made before the clone: it may not allocate.
struct Plan {
    /// The shim binary, opened: the holder execs it after its root is gone.
    exe: OwnedFd,
    /// Its path, the holder's argv[0].
    exe_path: CString,
    action: CString,
    dev_null: OwnedFd,
    hostname: Option<Vec<u8>>,
    netns: Option<OwnedFd>,
    userns: Option<OwnedFd>,
    unshare: libc::c_int,
    fork_pid1: bool,
    sysctls: Vec<(CString, Vec<u8>)>,
    /// `cgroup.procs` of the holder's cgroup in each hierarchy: the child joins before
    /// anything else, so the holder never runs outside it.
    cgroup_procs: Vec<OwnedFd>,
}

impl Plan {
    fn new(namespaces: &Namespaces, cgroup_procs: Vec<OwnedFd>) -> Result<Self, ShimError> {
        let path = std::env::current_exe().map_err(|e| ShimError::io("shim binary".into(), e))?;
        let exe = std::fs::File::open(&path)
            .map_err(|e| ShimError::io(format!("open {}", path.display()), e))?;
        refuse_a_dynamic_shim(&exe, &path)?;
        let exe = exe.into();
        let exe_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| ShimError::Internal(format!("shim binary path: {e}")))?;
        let dev_null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| ShimError::io("open /dev/null".into(), e))?
            .into();
        let action = CString::new(PAUSE_ACTION).map_err(|e| ShimError::Internal(e.to_string()))?;
        let netns: Option<OwnedFd> = match &namespaces.netns {
            Some(path) => Some(
                std::fs::File::open(path)
                    .map_err(|e| {
                        ShimError::io(format!("open network namespace {}", path.display()), e)
                    })?
                    .into(),
            ),
            None => None,
        };
        let userns = match (&netns, namespaces.userns) {
            (Some(netns), true) => Some(owning_userns(netns)?),
            (None, true) => {
                return Err(ShimError::InvalidArgument(
                    "a pod in its own user namespace needs its own network".into(),
                ));
            }
            (_, false) => None,
        };
        let sysctls = namespaces
            .sysctls
            .iter()
            .map(|(path, value)| {
                CString::new(format!("/proc/sys/{path}"))
                    .map(|path| (path, value.clone().into_bytes()))
                    .map_err(|e| ShimError::InvalidArgument(format!("sysctl {path}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            exe,
            exe_path,
            action,
            dev_null,
            hostname: (namespaces.uts && !namespaces.hostname.is_empty())
                .then(|| namespaces.hostname.clone().into_bytes()),
            netns,
            userns,
            // A mount namespace of its own too, which only the holder lives in.
            unshare: (namespaces.clone_flags() | CloneFlags::CLONE_NEWNS).bits(),
            fork_pid1: namespaces.pid,
            sysctls,
            cgroup_procs,
        })
    }
}

/// The holder execs the shim inside an empty root, where no dynamic loader is: a shim
/// linked dynamically could never hold a pod, so it says so before trying.
fn refuse_a_dynamic_shim(exe: &std::fs::File, path: &std::path::Path) -> Result<(), ShimError> {
    match crate::runtime::elf::dynamic_loader(exe) {
        Ok(Some(loader)) => Err(ShimError::FailedPrecondition(format!(
            "crius's shim {} is linked dynamically (it needs {loader}), but it holds a pod from \
             inside an empty root where no loader is: install the static shim `make shim` \
             builds (target/crius-shim/containerd-shim-crius-v2, scripts/build-shim.sh)",
            path.display()
        ))),
        Ok(None) => Ok(()),
        Err(e) => Err(ShimError::io(format!("read {}", path.display()), e)),
    }
}

/// The user namespace containerd's CRI made a pod's network namespace in (with the pod's
/// ID mappings): the holder joins it, so the pod's other namespaces are owned by it.
fn owning_userns(netns: &OwnedFd) -> Result<OwnedFd, ShimError> {
    // SAFETY: NS_GET_USERNS on a namespace fd returns a new fd or -1.
    let fd = unsafe { libc::ioctl(netns.as_raw_fd(), NS_GET_USERNS as _) };
    if fd < 0 {
        return Err(ShimError::io(
            "the user namespace of the pod's network".into(),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: a new fd the ioctl returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The child's steps, raw system calls only (it is a copy of a threaded process): join the
/// pod's user and network namespaces, make its others, name it, set its sysctls, then exec
/// the holder, after a fork when it must be PID 1 of a new PID namespace. Returns the
/// child's exit code; a failed step is written to `report`.
///
/// # Safety
/// Call only in the child of a clone, with `plan` and `report` valid.
unsafe fn run_child(plan: &Plan, report: libc::c_int) -> isize {
    let fail = |step: u8| -> isize {
        let failed = failure(step);
        // SAFETY: writes a stack buffer to the pipe's write end.
        unsafe { libc::write(report, failed.as_ptr().cast(), failed.len()) };
        1
    };
    let argv = [
        plan.exe_path.as_ptr(),
        plan.action.as_ptr(),
        std::ptr::null(),
    ];
    // The holder needs nothing from the shim's environment.
    let envp = [std::ptr::null()];
    // SAFETY: raw system calls on fds and buffers the plan keeps alive.
    unsafe {
        // "0": the writer itself; what it forks later is born in the cgroup.
        for fd in &plan.cgroup_procs {
            if libc::write(fd.as_raw_fd(), c"0".as_ptr().cast(), 1) != 1 {
                return fail(12);
            }
        }
        if let Some(fd) = &plan.userns
            && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWUSER) != 0
        {
            return fail(6);
        }
        if let Some(fd) = &plan.netns
            && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0
        {
            return fail(1);
        }
        if plan.unshare != 0 && libc::unshare(plan.unshare) != 0 {
            return fail(7);
        }
        if let Some(name) = &plan.hostname
            && libc::sethostname(name.as_ptr().cast(), name.len()) != 0
        {
            return fail(2);
        }
        for (path, value) in &plan.sysctls {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return fail(5);
            }
            let written = libc::write(fd, value.as_ptr().cast(), value.len());
            libc::close(fd);
            if written < 0 {
                return fail(5);
            }
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return fail(3);
        }
        if plan.fork_pid1 {
            // unshare(CLONE_NEWPID) put our children, not us, in the pod's PID namespace.
            let pid = libc::fork();
            if pid < 0 {
                return fail(8);
            }
            if pid > 0 {
                let told = record(PID_RECORD, pid);
                libc::write(report, told.as_ptr().cast(), told.len());
                return 0;
            }
        }
        let step = match shut_in(plan) {
            Ok(()) => {
                libc::fexecve(plan.exe.as_raw_fd(), argv.as_ptr(), envp.as_ptr());
                4
            }
            Err(step) => step,
        };
        let failed = failure(step);
        libc::write(report, failed.as_ptr().cast(), failed.len());
        libc::_exit(1)
    }
}

/// Shuts the holder in before its exec (raw system calls only): stdio on `/dev/null`, an
/// empty read-only root in its own mount namespace, no capabilities and no new privileges.
/// Returns the failed step.
///
/// # Safety
/// Call only in the child that execs the holder, in its own mount namespace.
unsafe fn shut_in(plan: &Plan) -> Result<(), u8> {
    // SAFETY: raw system calls on the plan's fds and on static strings.
    unsafe {
        for fd in 0..3 {
            if libc::dup2(plan.dev_null.as_raw_fd(), fd) < 0 {
                return Err(11);
            }
        }
        // Its mounts stop propagating either way; then its root becomes an empty read-only
        // tmpfs, mounted over /proc (there on every node) in this mount namespace only.
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            none.cast(),
        ) != 0
            || libc::mount(
                c"tmpfs".as_ptr(),
                c"/proc".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=4k,mode=0555".as_ptr().cast(),
            ) != 0
            || libc::chdir(c"/proc".as_ptr()) != 0
            || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
            || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0
            || libc::chdir(c"/".as_ptr()) != 0
        {
            return Err(9);
        }
        // An empty bounding set: an exec as root gains no capability either.
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) != 0
        {
            return Err(10);
        }
        let mut cap: libc::c_ulong = 0;
        while libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 {
            cap += 1;
        }
        // Past the last capability the kernel knows, the drop fails with EINVAL.
        if cap == 0 || *libc::__errno_location() != libc::EINVAL {
            return Err(10);
        }
        if crate::runtime::caps::capset(0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(10);
        }
    }
    Ok(())
}

/// Starts the holder and returns its pid once it has exec'd; it is born in the cgroup
/// whose `cgroup.procs` files `cgroup_procs` are (one per hierarchy). The caller must hold
/// a `Starting` of the shim's state so an early exit is kept for it.
pub fn spawn(namespaces: &Namespaces, cgroup_procs: Vec<OwnedFd>) -> Result<i32, ShimError> {
    let plan = Plan::new(namespaces, cgroup_procs)?;
    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ShimError::io("pipe".into(), e.into()))?;
    let writer_fd = writer.as_raw_fd();
    let mut stack = vec![0u8; STACK_SIZE];
    // SAFETY: the child runs only `run_child`'s system calls, then execs or exits.
    let child = Box::new(|| unsafe { run_child(&plan, writer_fd) });
    // SAFETY: see above; the plan outlives the call in this process.
    let pid =
        unsafe { nix::sched::clone(child, &mut stack, CloneFlags::empty(), Some(libc::SIGCHLD)) }
            .map_err(|e| ShimError::io("clone the pod's holder".into(), e.into()))?;
    drop(writer);
    let mut report = Vec::new();
    std::fs::File::from(reader)
        .take(64)
        .read_to_end(&mut report)
        .map_err(|e| ShimError::io("read the pod holder's start".into(), e))?;
    holder_pid(pid.as_raw(), &report)
}

/// The holder's pid from the child's report: the forked PID 1 it names, or the child
/// itself; a failed step is the error.
fn holder_pid(child: i32, report: &[u8]) -> Result<i32, ShimError> {
    let mut holder = child;
    for rec in report.chunks_exact(RECORD) {
        let value = i32::from_le_bytes([rec[1], rec[2], rec[3], rec[4]]);
        if rec[0] == PID_RECORD {
            holder = value;
            continue;
        }
        return Err(ShimError::io(
            format!("pod holder: {}", step_name(rec[0])),
            std::io::Error::from_raw_os_error(value),
        ));
    }
    Ok(holder)
}

/// The holder's life: reap what ends in the pod, end on SIGTERM or SIGINT.
pub fn pause() -> ! {
    // Not dumpable (an exec made it so again): its /proc files are the node's root's, and
    // only a tracer with CAP_SYS_PTRACE may look into it.
    // SAFETY: a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        std::process::exit(1);
    }
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT] {
        signals.add(signal);
    }
    if signals.thread_block().is_err() {
        std::process::exit(1);
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => reap_all(),
            Ok(_) => std::process::exit(0),
            Err(_) => {}
        }
    }
}

fn reap_all() {
    loop {
        // SAFETY: waitpid on any child, without keeping its status.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_namespaces_asked_for() {
        let host = Namespaces::default();
        assert!(host.clone_flags().is_empty());
        let pod = Namespaces {
            pid: true,
            ipc: true,
            uts: true,
            ..Default::default()
        };
        assert_eq!(
            pod.clone_flags(),
            CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS
        );
    }

    #[test]
    fn the_report_names_the_forked_pid_1_or_the_failed_step() {
        assert_eq!(holder_pid(10, &[]).expect("exec'd"), 10);
        assert_eq!(holder_pid(10, &record(PID_RECORD, 11)).expect("forked"), 11);
        let mut failed = record(PID_RECORD, 11).to_vec();
        failed.extend(record(4, libc::ENOENT));
        let err = holder_pid(10, &failed).expect_err("exec failed");
        assert!(err.to_string().contains("exec the shim"), "{err}");
    }

    #[test]
    fn a_failed_shut_in_says_which_part() {
        for (step, says) in [
            (9, "empty read-only root"),
            (10, "drop the holder's privileges"),
            (11, "stdio"),
        ] {
            let err = holder_pid(10, &record(step, libc::EPERM)).expect_err("failed");
            assert!(err.to_string().contains(says), "{step}: {err}");
        }
    }

    #[test]
    fn a_failure_report_carries_step_and_errno() {
        // SAFETY: sets errno for the test.
        unsafe { *libc::__errno_location() = libc::ENOENT };
        let report = failure(2);
        assert_eq!(report[0], 2);
        assert_eq!(
            i32::from_le_bytes([report[1], report[2], report[3], report[4]]),
            libc::ENOENT
        );
    }
}
