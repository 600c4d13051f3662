//! The verbs on a created container: kill, delete, pause, resume, pids, update, checkpoint.

use std::time::{Duration, SystemTime};

use containerd_shim_protos::api::Status;
use containerd_shim_protos::events::task::{TaskCheckpointed, TaskDelete, TaskPaused, TaskResumed};

use crate::error::ShimError;
use crate::runtime::reaper::Exit;
use crate::runtime::runc::{CheckpointFlags, RuncError};
use crate::task::container::Container;
use crate::task::create::unmount_rootfs;
use crate::task::events::topic;
use crate::task::shim::{Shim, timestamp};

/// The highest signal number Linux has (SIGRTMAX).
const MAX_SIGNAL: u32 = 64;

impl Shim {
    pub async fn kill(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), ShimError> {
        if signal == 0 || signal > MAX_SIGNAL {
            return Err(ShimError::InvalidArgument(format!("signal {signal}")));
        }
        let container = self.container(id)?;
        let process = container
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("process {exec_id} of container {id}")))?;
        if process.exit().is_some() {
            return Err(ShimError::NotFound("process already finished".into()));
        }
        if exec_id.is_empty() {
            let _ops = container.ops.lock().await;
            if process.exit().is_some() {
                return Err(ShimError::NotFound("process already finished".into()));
            }
            if container.held_pod {
                return signal_pid(process.pid(), signal);
            }
            if let Some(signalled) = signal_running_init(&container, signal, all) {
                return signalled;
            }
            return match container.runc.kill(&self.reaper, id, signal, all).await {
                Err(e) if e.is_gone() => {
                    Err(ShimError::NotFound("process already finished".into()))
                }
                other => Ok(other?),
            };
        }
        let pid = process.pid();
        if pid <= 0 {
            return Err(ShimError::FailedPrecondition(format!(
                "exec {exec_id} was not started"
            )));
        }
        signal_pid(pid, signal)
    }

    /// Deletes an exec's record, or a container: its runtime state, its rootfs mount.
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<(i32, Exit), ShimError> {
        let container = self.container(id)?;
        if !exec_id.is_empty() {
            return self.delete_exec(&container, exec_id);
        }
        let _ops = container.ops.lock().await;
        // A delete that waited for another one finds the container gone.
        if !self.has_container(id) {
            return Err(ShimError::NotFound(format!("container {id}")));
        }
        let init = container.init.clone();
        let snapshot = init.snapshot();
        let exit = match snapshot.exit {
            Some(exit) => {
                self.delete_stopped(&container).await?;
                exit
            }
            None if container.held_pod && snapshot.status == Status::CREATED => {
                signal_pid(snapshot.pid, libc::SIGKILL as u32).ok();
                let exit = wait_briefly(&init).await;
                self.delete_stopped(&container).await?;
                exit
            }
            None if snapshot.status == Status::CREATED => {
                container.runc.delete(&self.reaper, id, true).await?;
                wait_briefly(&init).await
            }
            None => {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {id} is running: kill it first"
                )));
            }
        };
        self.end_leftover_execs(&container);
        container.stop_oom_watch();
        if let Some(rootfs) = container.rootfs.clone() {
            unmount_rootfs(rootfs).await;
        }
        self.remove_container(id);
        self.events.publish(
            topic::DELETE,
            Box::new(TaskDelete {
                container_id: id.to_string(),
                pid: snapshot.pid as u32,
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            }),
        );
        Ok((snapshot.pid, exit))
    }

    /// Deletes the runtime's container once its init has exited; one that runc still
    /// thinks busy (processes left in a shared PID namespace) is deleted with force.
    async fn delete_stopped(&self, container: &Container) -> Result<(), ShimError> {
        let id = &container.id;
        if container.held_pod {
            remove_held_cgroup(container).await;
            return Ok(());
        }
        match container.runc.delete(&self.reaper, id, false).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_gone() => Ok(()),
            Err(e) => {
                log::info!("runc delete {id}: {e}; deleting with force");
                match container.runc.delete(&self.reaper, id, true).await {
                    Err(e) if !e.is_gone() => Err(e.into()),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Execs still without an exit when their container goes (they shared a PID namespace
    /// and were killed with it): their waiters get an exit and their stdio is let go.
    fn end_leftover_execs(&self, container: &Container) {
        for process in container.execs() {
            let exit = Exit {
                status: 137,
                at: SystemTime::now(),
            };
            if process.pid() > 0 && process.set_exited(exit) {
                self.publish_exit(&process, exit);
            }
        }
    }

    fn delete_exec(&self, container: &Container, exec_id: &str) -> Result<(i32, Exit), ShimError> {
        let process = container.process(exec_id).ok_or_else(|| {
            ShimError::NotFound(format!("exec {exec_id} of container {}", container.id))
        })?;
        let snapshot = process.snapshot();
        let exit = match snapshot.exit {
            Some(exit) => exit,
            None if snapshot.pid == 0 => Exit {
                status: 0,
                at: SystemTime::now(),
            },
            None => {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {exec_id} is running"
                )));
            }
        };
        container.remove_exec(exec_id);
        if let Some(spec_file) = &process.spec_file {
            let _ = std::fs::remove_file(spec_file);
        }
        Ok((snapshot.pid, exit))
    }

    pub async fn pause(&self, id: &str) -> Result<(), ShimError> {
        let container = self.container(id)?;
        container.refuse_if_held("pause")?;
        let _ops = container.ops.lock().await;
        self.in_state(&container, &[Status::RUNNING])?;
        container.runc.pause(&self.reaper, id).await?;
        container.init.set_status(Status::PAUSED);
        self.events.publish(
            topic::PAUSED,
            Box::new(TaskPaused {
                container_id: id.to_string(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    pub async fn resume(&self, id: &str) -> Result<(), ShimError> {
        let container = self.container(id)?;
        container.refuse_if_held("resume")?;
        let _ops = container.ops.lock().await;
        self.in_state(&container, &[Status::PAUSED])?;
        container.runc.resume(&self.reaper, id).await?;
        container.init.set_status(Status::RUNNING);
        self.events.publish(
            topic::RESUMED,
            Box::new(TaskResumed {
                container_id: id.to_string(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    /// Checks that the container's init has not exited and is in one of `states`.
    fn in_state(&self, container: &Container, states: &[Status]) -> Result<(), ShimError> {
        let snapshot = container.init.snapshot();
        if !states.contains(&snapshot.status) || snapshot.exit.is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is {:?}",
                container.id, snapshot.status
            )));
        }
        Ok(())
    }

    pub async fn pids(&self, id: &str) -> Result<Vec<(u32, Option<String>)>, ShimError> {
        let container = self.container(id)?;
        if container.held_pod {
            let pid = container.init.pid();
            return Ok(if container.init.exit().is_none() && pid > 0 {
                vec![(pid as u32, None)]
            } else {
                Vec::new()
            });
        }
        let pids = container.runc.ps(&self.reaper, id).await?;
        let execs = container.exec_pids();
        Ok(pids
            .into_iter()
            .map(|pid| (pid, execs.get(&(pid as i32)).cloned()))
            .collect())
    }

    pub async fn update(&self, id: &str, resources: Vec<u8>) -> Result<(), ShimError> {
        let container = self.container(id)?;
        container.refuse_if_held("update")?;
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&resources)
            .map_err(|e| ShimError::InvalidArgument(format!("resources: {e}")))?;
        let _ops = container.ops.lock().await;
        container.runc.update(&self.reaper, id, resources).await?;
        Ok(())
    }

    /// Checkpoints a running or paused container (containerd's client pauses it first).
    pub async fn checkpoint(&self, id: &str, mut flags: CheckpointFlags) -> Result<(), ShimError> {
        let container = self.container(id)?;
        container.refuse_if_held("checkpoint")?;
        let _ops = container.ops.lock().await;
        self.in_state(&container, &[Status::RUNNING, Status::PAUSED])?;
        if flags.work_path.is_empty() {
            // CRIU's log stays with the bundle, out of the image.
            flags.work_path = container.bundle.display().to_string();
        }
        container
            .runc
            .checkpoint(&self.reaper, id, &flags)
            .await
            .map_err(|e| match e {
                RuncError::Failed { verb, message } => RuncError::Failed {
                    verb,
                    message: format!("{message} (CRIU's log: {}/dump.log)", flags.work_path),
                },
                other => other,
            })?;
        self.events.publish(
            topic::CHECKPOINTED,
            Box::new(TaskCheckpointed {
                container_id: id.to_string(),
                checkpoint: flags.image_path.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }
}

/// Signals a process the shim reaps (so its pid is not reused before its exit is seen).
/// Signals a running container's init through its pidfd, as `runc kill` without `--all`
/// does (it signals the init alone), without running runc. `None` where runc must: a kill
/// of all processes, a paused or not yet started container (runc thaws a frozen one for
/// SIGKILL), a SIGKILL where the container shares a PID namespace (newer runc then kills
/// every process of its cgroup), no pidfd, or a pidfd that fails for another reason than
/// the init being gone.
fn signal_running_init(
    container: &Container,
    signal: u32,
    all: bool,
) -> Option<Result<(), ShimError>> {
    let shared_pid_kill = signal == libc::SIGKILL as u32 && !container.own_pid_namespace;
    if all || shared_pid_kill || container.init.snapshot().status != Status::RUNNING {
        return None;
    }
    let pidfd = container.init_pidfd.get()?;
    let signal = i32::try_from(signal).ok()?;
    match crate::runtime::pidfd::send_signal(pidfd, signal) {
        Ok(()) => Some(Ok(())),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            Some(Err(ShimError::NotFound("process already finished".into())))
        }
        Err(e) => {
            log::debug!(
                "signalling {} through its pidfd: {e}; runc kill",
                container.id
            );
            None
        }
    }
}

fn signal_pid(pid: i32, signal: u32) -> Result<(), ShimError> {
    // SAFETY: kill(2) with a positive pid and a signal number the caller checked.
    if pid > 0 && unsafe { libc::kill(pid, signal as i32) } == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error() {
        e if pid <= 0 || e.raw_os_error() == Some(libc::ESRCH) => {
            Err(ShimError::NotFound("process already finished".into()))
        }
        e => Err(ShimError::io("kill".into(), e)),
    }
}

/// Removes a held pod's cgroup once its holder is gone (off the async threads: a killed
/// process leaves its cgroup a moment later).
async fn remove_held_cgroup(container: &Container) {
    let Some(cgroup) = container.cgroup.clone() else {
        return;
    };
    let path = cgroup.path().to_string();
    let _ =
        tokio::task::spawn_blocking(move || crate::pod::held::remove_cgroup(&cgroup, &path)).await;
}

/// The exit of a process just killed, or a kill's status when it does not come in 2 s.
async fn wait_briefly(process: &crate::task::process::Process) -> Exit {
    tokio::time::timeout(Duration::from_secs(2), process.wait())
        .await
        .unwrap_or(Exit {
            status: 137,
            at: SystemTime::now(),
        })
}
