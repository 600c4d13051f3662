//! What an OCI runtime's refusal says about whose fault it was. runc reports every failure
//! as one text (containerd passes it on with code UNKNOWN); the few failures that come from
//! the request itself are told apart here by runc's stable wording, so the client gets a
//! client error for them and INTERNAL stays for what crius or the node got wrong.

use containerd_client::types::v1::Status as ProcessStatus;
use tonic::Code;

use crate::cri::CriService;

/// Whether the runtime could not run a process because its executable cannot be executed:
/// not there, not executable, not a program (`exec: "x": executable file not found in
/// $PATH`, `exec: "/x": stat /x: no such file or directory`, `exec: "/etc": permission
/// denied`).
pub(crate) fn unexecutable(message: &str) -> bool {
    // containerd's error text may carry runc's quoted, so its quotes come escaped.
    (message.contains("exec: \"") || message.contains("exec: \\\""))
        && [
            "executable file not found",
            "no such file or directory",
            "permission denied",
            "exec format error",
            "is a directory",
            "not a directory",
        ]
        .iter()
        .any(|reason| message.contains(reason))
}

/// Whether the runtime refused to exec because the container's cgroup is frozen: runc
/// freezes it while it signals every process of a container being stopped (`kill --all`),
/// so an exec racing a stop sees this while containerd still reports the task running.
pub(crate) fn frozen(message: &str) -> bool {
    message.contains("cannot exec in a paused container")
}

/// Whether the runtime's exec process was killed with SIGKILL as it started (runc exits
/// with 137): a stop killing every process of the container got to it first, or the
/// container's memory limit did. Either is the container's state, not a server fault.
pub(crate) fn killed_while_starting(message: &str) -> bool {
    message.contains("exec failed: exit status 137")
}

/// Whether the OCI runtime was killed (SIGKILL: runc exits 137) while it created the
/// container: the node's OOM killer or an operator took it, not a fault of crius's or of the
/// request. The shim deleted what it had made; a new attempt can succeed.
pub(crate) fn runtime_killed_while_creating(message: &str) -> bool {
    message.contains("create failed: exit status 137")
}

/// The code for the runtime's failure to start a container: a command its image cannot
/// run, or a namespace it joins that is gone (its PID namespace target, or its pod's pause
/// process, exited since it was created), is the container's state, not a server fault; a
/// runtime killed in the middle aborted the start.
pub(crate) fn container_start_code(message: &str) -> Code {
    let namespace_gone =
        message.contains("namespace path") && message.contains("no such file or directory");
    if unexecutable(message) || namespace_gone {
        Code::FailedPrecondition
    } else if runtime_killed_while_creating(message) {
        Code::Aborted
    } else {
        Code::Internal
    }
}

/// The code for the runtime's failure to set up a pod's pause process (runc's words) or
/// holder (crius's shim's): the kernel refusing one of the pod's sysctls or its hostname
/// is the pod config's fault.
pub(crate) fn sandbox_task_code(message: &str) -> Code {
    // "held pod": the shim refused the spec (a sysctl outside the pod's namespaces).
    let holder_refused = message.contains("pod holder: set the pod's sysctls")
        || message.contains("pod holder: set the hostname")
        || message.contains("held pod ");
    if message.contains("/proc/sys/") || message.contains("sethostname") || holder_refused {
        Code::InvalidArgument
    } else if runtime_killed_while_creating(message) {
        Code::Aborted
    } else {
        Code::Internal
    }
}

impl CriService {
    /// Whether container `id`'s task still runs (a stopped, paused or missing one does not;
    /// an error asking counts as running, so the failure stays a server error).
    pub(crate) async fn task_runs(&self, id: &str) -> bool {
        match self.containerd.task_state(id).await {
            Ok(Some(task)) => task.status == ProcessStatus::Running,
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_killed_as_it_started_is_told_apart() {
        assert!(killed_while_starting(
            "starting exec in container abc: containerd start task: code: 'Unknown error', message: \"runc exec failed: exit status 137: unknown\""
        ));
        assert!(!killed_while_starting(
            "runc exec failed: exit status 1: unknown"
        ));
        assert!(!killed_while_starting("exec exited with status 137"));
    }

    #[test]
    fn a_runtime_killed_while_it_created_aborts_the_start() {
        let killed = "failed to start container c1: containerd create task: code: 'Unknown error', message: \"failed to create shim task: runc create failed: exit status 137: unknown\"";
        assert_eq!(container_start_code(killed), Code::Aborted);
        assert_eq!(sandbox_task_code(killed), Code::Aborted);
        let failed = "failed to create shim task: runc create failed: exit status 1: unknown";
        assert_eq!(container_start_code(failed), Code::Internal);
    }

    #[test]
    fn a_refused_sysctl_or_hostname_is_the_pods_fault() {
        for message in [
            "runc create failed: unable to start container process: error during container init: open /proc/sys/net/x: no such file or directory: unknown",
            "failed to create shim task: pod holder: set the pod's sysctls: Invalid argument (os error 22): unknown",
            "failed to create shim task: pod holder: set the hostname: Invalid argument (os error 22): unknown",
            r#"failed to create shim task: held pod p1: sysctl "kernel.panic": not scoped by a pod's namespaces: invalid argument"#,
        ] {
            assert_eq!(
                sandbox_task_code(message),
                Code::InvalidArgument,
                "{message}"
            );
        }
        let other = "failed to create shim task: pod holder: fork the pod's PID 1: Resource temporarily unavailable (os error 11)";
        assert_eq!(sandbox_task_code(other), Code::Internal);
    }

    #[test]
    fn runcs_words_for_a_command_that_cannot_run() {
        for message in [
            r#"OCI runtime exec failed: exec failed: unable to start container process: exec: "/nonexistent/binary": stat /nonexistent/binary: no such file or directory: unknown"#,
            r#"runc create failed: unable to start container process: exec: "37fab": executable file not found in $PATH: unknown"#,
            r#"unable to start container process: exec: "/etc/passwd": permission denied: unknown"#,
            r#"containerd start task: message: "OCI runtime exec failed: exec: \"\": executable file not found in $PATH: unknown""#,
        ] {
            assert!(unexecutable(message), "{message}");
        }
        for message in [
            "namespace path: lstat /proc/635/ns/ipc: no such file or directory: unknown",
            "cannot exec in a stopped container: unknown",
        ] {
            assert!(!unexecutable(message), "{message}");
        }
    }

    #[test]
    fn an_exec_into_a_frozen_container_is_told_apart() {
        assert!(frozen(
            r#"containerd start task: code: 'Unknown error', message: "runc exec failed: exec failed: cannot exec in a paused container (use --ignore-paused to override): unknown""#
        ));
        assert!(!frozen("cannot exec in a stopped container: unknown"));
    }

    #[test]
    fn a_start_that_cannot_run_the_command_or_join_a_namespace_is_the_containers_state() {
        for message in [
            r#"runc create failed: unable to start container process: exec: "x": executable file not found in $PATH: unknown"#,
            "runc create failed: unable to create new parent process: namespace path: lstat /proc/9813/ns/pid: no such file or directory",
        ] {
            assert_eq!(
                container_start_code(message),
                Code::FailedPrecondition,
                "{message}"
            );
        }
        assert_eq!(
            container_start_code(
                "runc create failed: unable to start container process: can't get final child's PID from pipe: EOF"
            ),
            Code::Internal
        );
    }

    #[test]
    fn the_kernel_refusing_a_sysctl_or_hostname_is_the_pods_fault() {
        assert_eq!(
            sandbox_task_code(
                "error during container init: write /proc/sys/net/ipv4/ip_forward: invalid argument"
            ),
            Code::InvalidArgument
        );
        assert_eq!(
            sandbox_task_code("error during container init: sethostname: invalid argument"),
            Code::InvalidArgument
        );
        assert_eq!(
            sandbox_task_code("can't get final child's PID from pipe: EOF"),
            Code::Internal
        );
    }
}
