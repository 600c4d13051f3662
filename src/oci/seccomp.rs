//! Seccomp for containers: crius's own RuntimeDefault profile (the policy containerd's and
//! Docker's default profiles enforce: an allow list, more syscalls for the capabilities that
//! need them, namespace-creating `clone` only with CAP_SYS_ADMIN), localhost profiles loaded
//! from JSON, and the choice between them from the CRI fields.

use std::path::Path;

use crate::api::v1::SecurityProfile;
use crate::api::v1::security_profile::ProfileType;
use oci_spec::runtime::{Capabilities, Capability, LinuxSeccomp};
use serde_json::{Value, json};

use super::SpecError;

/// Syscalls every container may make.
const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_time64",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socket",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

/// Syscalls a capability unlocks.
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "setdomainname",
            "sethostname",
            "setns",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &[
            "delete_module",
            "init_module",
            "finit_module",
            "query_module",
        ],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &[
            "settimeofday",
            "stime",
            "clock_settime",
            "clock_settime64",
            "adjtimex",
            "clock_adjtime",
            "clock_adjtime64",
        ],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &["get_mempolicy", "mbind", "set_mempolicy"],
    ),
    (Capability::Syslog, &["syslog"]),
];

/// The namespace flags `clone` may not carry without CAP_SYS_ADMIN.
const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

const ENOSYS: u32 = 38;
const EPERM: u32 = 1;

fn architectures() -> Vec<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => vec!["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "aarch64" => vec!["SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"],
        "s390x" => vec!["SCMP_ARCH_S390", "SCMP_ARCH_S390X"],
        _ => Vec::new(),
    }
}

fn arch_syscalls() -> &'static [&'static str] {
    match std::env::consts::ARCH {
        "x86_64" => &["arch_prctl", "modify_ldt"],
        "x86" => &["modify_ldt"],
        "aarch64" | "arm" => &[
            "arm_fadvise64_64",
            "arm_sync_file_range",
            "breakpoint",
            "cacheflush",
            "set_tls",
        ],
        "s390x" => &[
            "s390_pci_mmio_read",
            "s390_pci_mmio_write",
            "s390_runtime_instr",
        ],
        _ => &[],
    }
}

/// The RuntimeDefault profile for a process with the bounding capabilities `caps`.
pub fn default_profile(caps: &Capabilities) -> Result<LinuxSeccomp, SpecError> {
    let mut rules: Vec<Value> = vec![json!({"names": ALLOWED, "action": "SCMP_ACT_ALLOW"})];
    // personality: only the harmless personas.
    for persona in [0u64, 0x0008, 0x20000, 0x20008, 0xffff_ffff] {
        rules.push(json!({
            "names": ["personality"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": persona, "op": "SCMP_CMP_EQ"}],
        }));
    }
    rules.push(json!({"names": arch_syscalls(), "action": "SCMP_ACT_ALLOW"}));
    for (cap, names) in BY_CAPABILITY {
        if caps.contains(cap) {
            rules.push(json!({"names": names, "action": "SCMP_ACT_ALLOW"}));
        }
    }
    if !caps.contains(&Capability::SysAdmin) {
        // clone without namespace flags; clone3 cannot be filtered by flag: make libc fall
        // back to clone by answering ENOSYS.
        let flags_arg = if std::env::consts::ARCH == "s390x" {
            1
        } else {
            0
        };
        rules.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": flags_arg, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }));
        rules.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}));
    }
    let profile = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": architectures(),
        "syscalls": rules,
    });
    serde_json::from_value(profile)
        .map_err(|e| SpecError::Invalid(format!("building the default seccomp profile: {e}")))
}

/// Loads a localhost profile (OCI `LinuxSeccomp` JSON) from `path`.
pub fn load_profile(path: &str) -> Result<LinuxSeccomp, SpecError> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(SpecError::Invalid(format!(
            "seccomp profile path {path:?} must be absolute"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        SpecError::Invalid(format!(
            "failed to load seccomp profile {}: {e}",
            path.display()
        ))
    })?;
    serde_json::from_str(&text)
        .map_err(|e| SpecError::Invalid(format!("invalid seccomp profile {}: {e}", path.display())))
}

/// What seccomp a process gets: `None` for unconfined.
pub fn select(
    profile: Option<&SecurityProfile>,
    legacy_path: &str,
    privileged: bool,
    caps: &Capabilities,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    if privileged {
        return Ok(None);
    }
    if let Some(profile) = profile {
        return match ProfileType::try_from(profile.profile_type) {
            Ok(ProfileType::RuntimeDefault) => default_profile(caps).map(Some),
            Ok(ProfileType::Unconfined) => Ok(None),
            Ok(ProfileType::Localhost) => load_profile(&profile.localhost_ref).map(Some),
            Err(_) => Err(SpecError::Invalid(format!(
                "unknown seccomp profile type {}",
                profile.profile_type
            ))),
        };
    }
    match legacy_path {
        "" | "unconfined" => Ok(None),
        "runtime/default" | "docker/default" => default_profile(caps).map(Some),
        other => match other.strip_prefix("localhost/") {
            Some(path) => load_profile(path).map(Some),
            None => Err(SpecError::Invalid(format!(
                "unsupported seccomp profile {other:?}: use runtime/default, unconfined or localhost/<path>"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(profile: &LinuxSeccomp) -> Vec<String> {
        profile
            .syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|s| s.args().is_none())
            .flat_map(|s| s.names().clone())
            .collect()
    }

    #[test]
    fn sethostname_needs_sys_admin() {
        let mut caps = crate::oci::default_capabilities();
        let plain = default_profile(&caps).unwrap();
        assert!(!names(&plain).contains(&"sethostname".to_string()));
        assert!(names(&plain).contains(&"read".to_string()));
        caps.insert(Capability::SysAdmin);
        let admin = default_profile(&caps).unwrap();
        assert!(names(&admin).contains(&"sethostname".to_string()));
        let json = serde_json::to_value(&admin).unwrap();
        assert_eq!(json["defaultAction"], "SCMP_ACT_ERRNO");
    }

    #[test]
    fn selection_follows_the_cri_fields() {
        let caps = crate::oci::default_capabilities();
        assert!(select(None, "", false, &caps).unwrap().is_none());
        assert!(
            select(None, "runtime/default", false, &caps)
                .unwrap()
                .is_some()
        );
        assert!(
            select(None, "runtime/default", true, &caps)
                .unwrap()
                .is_none()
        );
        assert!(select(None, "weird", false, &caps).is_err());
        let missing = SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "/nonexistent/profile.json".into(),
        };
        let err = select(Some(&missing), "", false, &caps).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/profile.json"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        std::fs::write(&path, r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#).unwrap();
        let local = SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: path.display().to_string(),
        };
        assert!(select(Some(&local), "", false, &caps).unwrap().is_some());
        assert!(
            select(None, &format!("localhost/{}", path.display()), false, &caps)
                .unwrap()
                .is_some()
        );
    }
}
