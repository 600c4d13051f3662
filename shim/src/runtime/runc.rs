//! The OCI runtime's command line (runc and runtimes that share it, like crun): each verb
//! the task service needs, run through the reaper so the shim's own reaping never steals a
//! command's exit status.
//!
//! Written here rather than with the `runc` crate: that crate spawns through tokio's process
//! driver, which reaps on its own and races the shim's subreaper loop, and it brings
//! `oci-spec`'s builders the shim does not need.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::runtime::reaper::Reaper;

/// At most this much of a command's output is kept (`runc ps` of a big container is the
/// largest).
const MAX_OUTPUT: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    #[error("runc {verb}: {source}")]
    Spawn {
        verb: &'static str,
        source: std::io::Error,
    },
    #[error("runc {verb} failed: {message}")]
    Failed { verb: &'static str, message: String },
}

impl RuncError {
    /// Whether runc said the container or process is gone already.
    pub fn is_gone(&self) -> bool {
        let RuncError::Failed { message, .. } = self else {
            return false;
        };
        let message = message.to_ascii_lowercase();
        [
            "not running",
            "does not exist",
            "no such process",
            "process already finished",
        ]
        .iter()
        .any(|m| message.contains(m))
    }
}

/// How the shim runs the OCI runtime for one container; kept in the bundle so the `delete`
/// action finds the same runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Runc {
    pub binary: String,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    #[serde(default)]
    pub no_pivot_root: bool,
    #[serde(default)]
    pub no_new_keyring: bool,
    /// runc's JSON log for this bundle: where create and exec put their errors.
    pub log: PathBuf,
    /// `binary` found on the PATH once: spawning by a bare name tries `execve` in every
    /// PATH directory before the right one, on every call.
    #[serde(skip)]
    pub program: Option<PathBuf>,
}

/// The stdio a created process gets (none: /dev/null).
#[derive(Default)]
pub struct ProcessStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Where a container's init is launched from: its id, bundle, pid file and console socket.
pub struct InitLaunch<'a> {
    pub id: &'a str,
    pub bundle: &'a Path,
    pub pid_file: &'a Path,
    pub console_socket: Option<&'a Path>,
}

/// Checkpoint flags, from containerd's runc checkpoint options.
#[derive(Debug, Default)]
pub struct CheckpointFlags {
    pub image_path: String,
    pub work_path: String,
    pub leave_running: bool,
    pub tcp_established: bool,
    pub external_unix_sockets: bool,
    pub shell_job: bool,
    pub file_locks: bool,
    pub empty_namespaces: Vec<String>,
    pub cgroups_mode: String,
}

impl Runc {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = match &self.program {
            Some(program) => Command::new(program),
            None => Command::new(&self.binary),
        };
        command
            .arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&self.log)
            .args(["--log-format", "json"]);
        if self.systemd_cgroup {
            command.arg("--systemd-cgroup");
        }
        command.args(args);
        command
    }

    pub async fn create(
        &self,
        reaper: &Reaper,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: ProcessStdio,
    ) -> Result<(), RuncError> {
        let mut command = self.command(&["create", "--bundle"]);
        command.arg(bundle).arg("--pid-file").arg(pid_file);
        if let Some(socket) = console_socket {
            command.arg("--console-socket").arg(socket);
        }
        if self.no_pivot_root {
            command.arg("--no-pivot");
        }
        if self.no_new_keyring {
            command.arg("--no-new-keyring");
        }
        command.arg(id);
        self.run_with_stdio(reaper, "create", command, stdio).await
    }

    /// `runc restore --detach`: the init process comes back from CRIU's images in
    /// `checkpoint` (already running when this returns), as `runc create` would start it.
    pub async fn restore(
        &self,
        reaper: &Reaper,
        launch: &InitLaunch<'_>,
        checkpoint: &Path,
        stdio: ProcessStdio,
    ) -> Result<(), RuncError> {
        let mut command = self.command(&["restore", "--detach", "--no-subreaper", "--bundle"]);
        command
            .arg(launch.bundle)
            .arg("--pid-file")
            .arg(launch.pid_file)
            .arg("--image-path")
            .arg(checkpoint)
            .arg("--work-path")
            .arg(launch.bundle);
        if let Some(socket) = launch.console_socket {
            command.arg("--console-socket").arg(socket);
        }
        if self.no_pivot_root {
            command.arg("--no-pivot");
        }
        command.arg(launch.id);
        self.run_with_stdio(reaper, "restore", command, stdio).await
    }

    pub async fn exec(
        &self,
        reaper: &Reaper,
        id: &str,
        process_file: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: ProcessStdio,
    ) -> Result<(), RuncError> {
        let mut command = self.command(&["exec", "--detach", "--process"]);
        command.arg(process_file).arg("--pid-file").arg(pid_file);
        if let Some(socket) = console_socket {
            command.arg("--console-socket").arg(socket);
        }
        command.arg(id);
        self.run_with_stdio(reaper, "exec", command, stdio).await
    }

    /// Starts a created container: as `runc start` does it, in the shim (see `exec_fifo`),
    /// when the runtime is runc and the start asks nothing else of it; else `runc start`.
    pub async fn start_created(
        &self,
        reaper: &Reaper,
        id: &str,
        init_pid: i32,
        poststart_hooks: bool,
    ) -> Result<(), RuncError> {
        if self.is_runc() && !poststart_hooks && std::env::var_os("NOTIFY_SOCKET").is_none() {
            match crate::runtime::exec_fifo::start(&self.root.join(id), init_pid).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(RuncError::Failed {
                        verb: "start",
                        message: e.to_string(),
                    });
                }
            }
        }
        self.start(reaper, id).await
    }

    /// Whether the runtime is runc itself (whose state directory the shim knows).
    pub(crate) fn is_runc(&self) -> bool {
        Path::new(&self.binary).file_name() == Some(std::ffi::OsStr::new("runc"))
    }

    pub async fn start(&self, reaper: &Reaper, id: &str) -> Result<(), RuncError> {
        self.run(reaper, "start", self.command(&["start", id]), None)
            .await
            .map(drop)
    }

    pub async fn delete(&self, reaper: &Reaper, id: &str, force: bool) -> Result<(), RuncError> {
        let args: &[&str] = if force {
            &["delete", "--force", id]
        } else {
            &["delete", id]
        };
        self.run(reaper, "delete", self.command(args), None)
            .await
            .map(drop)
    }

    pub async fn kill(
        &self,
        reaper: &Reaper,
        id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), RuncError> {
        let signal = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, signal.as_str()]);
        self.run(reaper, "kill", self.command(&args), None)
            .await
            .map(drop)
    }

    pub async fn pause(&self, reaper: &Reaper, id: &str) -> Result<(), RuncError> {
        self.run(reaper, "pause", self.command(&["pause", id]), None)
            .await
            .map(drop)
    }

    pub async fn resume(&self, reaper: &Reaper, id: &str) -> Result<(), RuncError> {
        self.run(reaper, "resume", self.command(&["resume", id]), None)
            .await
            .map(drop)
    }

    /// The pids of every process in the container.
    pub async fn ps(&self, reaper: &Reaper, id: &str) -> Result<Vec<u32>, RuncError> {
        let output = self
            .run(
                reaper,
                "ps",
                self.command(&["ps", "--format", "json", id]),
                None,
            )
            .await?;
        let pids: Option<Vec<u32>> =
            serde_json::from_slice(&output).map_err(|e| RuncError::Failed {
                verb: "ps",
                message: format!("unreadable output: {e}"),
            })?;
        Ok(pids.unwrap_or_default())
    }

    /// Applies an OCI `LinuxResources` JSON document.
    pub async fn update(
        &self,
        reaper: &Reaper,
        id: &str,
        resources: Vec<u8>,
    ) -> Result<(), RuncError> {
        let command = self.command(&["update", "--resources", "-", id]);
        self.run(reaper, "update", command, Some(resources))
            .await
            .map(drop)
    }

    pub async fn checkpoint(
        &self,
        reaper: &Reaper,
        id: &str,
        flags: &CheckpointFlags,
    ) -> Result<(), RuncError> {
        let mut command = self.command(&["checkpoint", "--image-path"]);
        command.arg(&flags.image_path);
        if !flags.work_path.is_empty() {
            command.arg("--work-path").arg(&flags.work_path);
        }
        let switches = [
            (flags.leave_running, "--leave-running"),
            (flags.tcp_established, "--tcp-established"),
            (flags.external_unix_sockets, "--ext-unix-sk"),
            (flags.shell_job, "--shell-job"),
            (flags.file_locks, "--file-locks"),
        ];
        for (on, switch) in switches {
            if on {
                command.arg(switch);
            }
        }
        for namespace in &flags.empty_namespaces {
            command.arg("--empty-ns").arg(namespace);
        }
        if !flags.cgroups_mode.is_empty() {
            command
                .arg("--manage-cgroups-mode")
                .arg(&flags.cgroups_mode);
        }
        command.arg(id);
        self.run(reaper, "checkpoint", command, None)
            .await
            .map(drop)
    }

    /// Runs a command that hands its stdio to a container process; its errors are in the
    /// log, since its stderr is the container's.
    pub(crate) async fn run_with_stdio(
        &self,
        reaper: &Reaper,
        verb: &'static str,
        mut command: Command,
        stdio: ProcessStdio,
    ) -> Result<(), RuncError> {
        let to_stdio = |fd: Option<OwnedFd>| fd.map(Stdio::from).unwrap_or_else(Stdio::null);
        command
            .stdin(to_stdio(stdio.stdin))
            .stdout(to_stdio(stdio.stdout))
            .stderr(to_stdio(stdio.stderr));
        let log_start = log_length(&self.log);
        let (pid, mut status) = reaper
            .spawn(&mut command)
            .map_err(|source| RuncError::Spawn { verb, source })?;
        // The command holds the container's stdio; the shim's copies close with it.
        drop(command);
        let ((), code) = within_limit(
            verb,
            time_limit(verb),
            pid,
            &mut status,
            std::future::ready(()),
        )
        .await?;
        if code == 0 {
            return Ok(());
        }
        Err(RuncError::Failed {
            verb,
            message: last_log_error(&self.log, log_start)
                .unwrap_or_else(|| format!("exit status {code}")),
        })
    }

    /// Runs a command to its end and returns its stdout.
    async fn run(
        &self,
        reaper: &Reaper,
        verb: &'static str,
        mut command: Command,
        input: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, RuncError> {
        let spawn_error = |source| RuncError::Spawn { verb, source };
        command
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let log_start = log_length(&self.log);
        let (pid, stdin, stdout, stderr, mut status) =
            spawn_with_pipes(reaper, &mut command).map_err(spawn_error)?;
        let write_input = async {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                let _ = stdin.write_all(&input).await;
            }
        };
        let io = async {
            let (_, out, err) = tokio::join!(write_input, read_all(stdout), read_all(stderr));
            (out, err)
        };
        let ((out, err), code) = within_limit(verb, time_limit(verb), pid, &mut status, io).await?;
        if code == 0 {
            return Ok(out);
        }
        let stderr = String::from_utf8_lossy(&err).trim().to_string();
        let message = last_log_error(&self.log, log_start)
            .or((!stderr.is_empty()).then_some(stderr))
            .unwrap_or_else(|| format!("exit status {code}"));
        Err(RuncError::Failed { verb, message })
    }
}

type Pipes = (
    i32,
    Option<pipe::Sender>,
    Option<pipe::Receiver>,
    Option<pipe::Receiver>,
    tokio::sync::oneshot::Receiver<u32>,
);

/// Spawns through the reaper and turns the child's pipes into async ones.
fn spawn_with_pipes(reaper: &Reaper, command: &mut Command) -> std::io::Result<Pipes> {
    let (pid, (stdin, stdout, stderr), status) = reaper.spawn_with(command, |child| {
        let stdin = child.stdin.take().map(OwnedFd::from);
        let stdout = child.stdout.take().map(OwnedFd::from);
        let stderr = child.stderr.take().map(OwnedFd::from);
        (stdin, stdout, stderr)
    })?;
    let stdin = stdin.map(pipe::Sender::from_owned_fd).transpose()?;
    let stdout = stdout.map(pipe::Receiver::from_owned_fd).transpose()?;
    let stderr = stderr.map(pipe::Receiver::from_owned_fd).transpose()?;
    Ok((pid, stdin, stdout, stderr, status))
}

/// How long one runc command may take before it is killed: a runc stuck (on a frozen
/// cgroup, a hook that never returns) would otherwise hold its container's operations for
/// good. CRIU's checkpoint and restore take what the container's memory needs.
const RUNC_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

pub(crate) fn time_limit(verb: &str) -> Option<std::time::Duration> {
    (!matches!(verb, "checkpoint" | "restore")).then_some(RUNC_TIME_LIMIT)
}

/// Runs `io` (the command's pipes) and waits for its exit status, both within `limit`;
/// past it the command is killed. Returns what `io` gave and the exit code.
pub(crate) async fn within_limit<T>(
    verb: &'static str,
    limit: Option<std::time::Duration>,
    pid: i32,
    status: &mut tokio::sync::oneshot::Receiver<u32>,
    io: impl std::future::Future<Output = T>,
) -> Result<(T, u32), RuncError> {
    let finished = async {
        let out = io.await;
        let code = (&mut *status).await.unwrap_or(255);
        (out, code)
    };
    let Some(limit) = limit else {
        return Ok(finished.await);
    };
    match tokio::time::timeout(limit, finished).await {
        Ok(done) => Ok(done),
        Err(_) => {
            // No status yet: the reaper has not collected it, so the pid is still runc's.
            if matches!(
                status.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            ) {
                // SAFETY: a signal to our own child, not reaped yet.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            Err(RuncError::Failed {
                verb,
                message: format!("runc did not finish within {limit:?} and was killed"),
            })
        }
    }
}

async fn read_all(pipe: Option<pipe::Receiver>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(pipe) = pipe {
        let _ = pipe.take(MAX_OUTPUT).read_to_end(&mut out).await;
    }
    out
}

fn log_length(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// The message of the last error runc logged past byte `start` (what one command logged),
/// if any.
pub fn last_log_error(log: &Path, start: u64) -> Option<String> {
    #[derive(Deserialize)]
    struct Entry {
        level: Option<String>,
        msg: Option<String>,
    }
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(log).ok()?;
    let length = file.metadata().ok()?.len();
    // The tail of what this command wrote is enough for its error.
    let from = start.max(length.saturating_sub(64 * 1024));
    file.seek(std::io::SeekFrom::Start(from)).ok()?;
    let mut text = Vec::new();
    file.take(64 * 1024).read_to_end(&mut text).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Entry>(line).ok())
        .find(|e| matches!(e.level.as_deref(), Some("error" | "fatal")))
        .and_then(|e| e.msg)
}

/// Reads the pid runc wrote.
pub fn read_pid_file(path: &Path) -> std::io::Result<i32> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(std::io::Error::other)
}

/// The runc options containerd passes (runc's own shim options message).
#[derive(Debug, Default, Clone)]
pub struct RuncOptions {
    pub binary: String,
    pub root: String,
    pub systemd_cgroup: bool,
    pub no_pivot_root: bool,
    pub no_new_keyring: bool,
}

/// The runtime for a container of `namespace` in `bundle`, with containerd's defaults.
pub fn runc_for(options: &RuncOptions, namespace: &str, bundle: &Path) -> Runc {
    let binary = match options.binary.as_str() {
        "" => "runc",
        binary => binary,
    };
    let root = match options.root.as_str() {
        "" => "/run/containerd/runc",
        root => root,
    };
    Runc {
        binary: binary.to_string(),
        root: Path::new(root).join(namespace),
        systemd_cgroup: options.systemd_cgroup,
        no_pivot_root: options.no_pivot_root,
        no_new_keyring: options.no_new_keyring,
        log: bundle.join("log.json"),
        program: find_program(binary, std::env::var_os("PATH").as_deref()),
    }
}

/// Where `binary` is found as `execvp` would find it: itself when it names a path, else
/// the first executable file of that name in a `path` directory. None: not found (the
/// spawn then fails with the usual error).
pub fn find_program(binary: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if binary.contains('/') {
        return Some(PathBuf::from(binary));
    }
    std::env::split_paths(path?)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(binary))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_is_found_on_the_path_once() {
        use std::os::unix::fs::PermissionsExt;
        let dirs = [
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        ];
        // Not executable in the first directory, executable in the second.
        std::fs::write(dirs[0].path().join("rt"), "").expect("write");
        let runnable = dirs[1].path().join("rt");
        std::fs::write(&runnable, "").expect("write");
        std::fs::set_permissions(&runnable, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = std::env::join_paths(dirs.iter().map(|d| d.path())).expect("join");
        assert_eq!(find_program("rt", Some(&path)), Some(runnable));
        assert_eq!(find_program("missing", Some(&path)), None);
        assert_eq!(
            find_program("/opt/rt/runc", Some(&path)),
            Some(PathBuf::from("/opt/rt/runc"))
        );
        assert_eq!(find_program("rt", None), None);
    }

    #[test]
    fn the_last_error_in_runcs_log_is_the_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log.json");
        std::fs::write(
            &log,
            concat!(
                "{\"level\":\"error\",\"msg\":\"first\"}\n",
                "{\"level\":\"info\",\"msg\":\"noise\"}\n",
                "not json\n",
                "{\"level\":\"error\",\"msg\":\"exec: \\\"nope\\\": not found\"}\n",
                "{\"level\":\"debug\",\"msg\":\"later\"}\n"
            ),
        )
        .expect("write log");
        assert_eq!(
            last_log_error(&log, 0).as_deref(),
            Some("exec: \"nope\": not found")
        );
        assert_eq!(last_log_error(&dir.path().join("missing"), 0), None);
        // Only what a command appended counts: an older error is not its error.
        let end = log_length(&log);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(b"{\"level\":\"info\",\"msg\":\"fine\"}\n")
            })
            .expect("append");
        assert_eq!(last_log_error(&log, end), None);
    }

    #[test]
    fn gone_containers_are_recognised() {
        let gone = RuncError::Failed {
            verb: "kill",
            message: "container not running".into(),
        };
        let other = RuncError::Failed {
            verb: "kill",
            message: "permission denied".into(),
        };
        assert!(gone.is_gone());
        assert!(!other.is_gone());
    }
}
