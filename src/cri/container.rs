//! What the container RPCs share: directories, the metadata extension, state conversion,
//! exit handling and stopping a container's process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::v1::ContainerState as CriState;
use tonic::Status;

use super::sandbox::internal;
use super::unix_nanos;
use crate::cri::CriService;
use crate::store::{Container, ContainerState};

/// How long an exited container's output may keep flowing before its log is closed.
pub const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// How long recording an exit waits for the exited task's delete.
pub const TASK_DELETE_WAIT: Duration = Duration::from_secs(10);
/// Exit code and reason of a container whose start failed, as containerd reports them.
pub const START_ERROR_EXIT_CODE: i32 = 128;
pub const START_ERROR_REASON: &str = "StartError";

pub fn cri_state(state: ContainerState) -> i32 {
    match state {
        ContainerState::Created => CriState::ContainerCreated as i32,
        ContainerState::Running => CriState::ContainerRunning as i32,
        ContainerState::Exited => CriState::ContainerExited as i32,
        ContainerState::Unknown => CriState::ContainerUnknown as i32,
    }
}

/// The reason a container exited with `code`.
fn exit_reason(code: i32, oom_killed: bool) -> &'static str {
    if oom_killed {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

/// A stop signal as the CRI's `Signal` enum (for `ContainerStatus.stop_signal`).
pub fn cri_stop_signal(name: &str) -> crate::api::v1::Signal {
    let signal = stop_signal(name);
    crate::api::v1::Signal::from_str_name(signal.as_str())
        .unwrap_or(crate::api::v1::Signal::Sigterm)
}

/// The signal number for an image's stop signal (`SIGTERM`, `TERM`, `15`); SIGTERM when
/// unset or unknown.
pub fn stop_signal(name: &str) -> nix::sys::signal::Signal {
    use nix::sys::signal::Signal;
    if name.is_empty() {
        return Signal::SIGTERM;
    }
    if let Ok(number) = name.parse::<i32>() {
        return Signal::try_from(number).unwrap_or(Signal::SIGTERM);
    }
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse::<Signal>().unwrap_or(Signal::SIGTERM)
}

impl CriService {
    pub(crate) fn container_root_dir(&self, id: &str) -> PathBuf {
        self.config.root.join("containers").join(id)
    }

    /// The snapshotter a sandbox or container recorded (`recorded`), or, for records from
    /// before handlers had their own, `containerd.snapshotter`.
    pub(crate) fn snapshotter_of<'a>(&'a self, recorded: &'a str) -> &'a str {
        if recorded.is_empty() {
            &self.config.containerd.snapshotter
        } else {
            recorded
        }
    }

    pub(crate) fn container_state_dir(&self, id: &str) -> PathBuf {
        self.config.state.join("containers").join(id)
    }

    pub(crate) fn find_container(&self, id: &str) -> Result<Option<Arc<Container>>, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("container ID is required"));
        }
        self.containers
            .get(id)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    pub(crate) fn require_container(&self, id: &str) -> Result<Arc<Container>, Status> {
        self.find_container(id)?
            .ok_or_else(|| Status::not_found(format!("container {id:?} not found")))
    }

    /// Whether `container` is still the one stored under its ID (not removed while a caller
    /// waited for its lock).
    pub(crate) fn is_stored(&self, container: &Arc<Container>) -> bool {
        self.containers
            .get(container.id())
            .ok()
            .flatten()
            .is_some_and(|stored| Arc::ptr_eq(&stored, container))
    }

    /// Records a container's exit: drains its output (bounded), stores code, time and
    /// reason, and deletes its task. Idempotent.
    pub(crate) async fn handle_container_exit(
        &self,
        container: &Arc<Container>,
        code: u32,
        at: SystemTime,
    ) {
        if container.status().state == ContainerState::Exited || !container.claim_exit() {
            // Recorded already, or being recorded by another path: wait for that one.
            container.wait_exited().await;
            return;
        }
        container.io.drain(EXIT_DRAIN).await;
        // The task goes before the exit shows: StopContainer, which waits for the exit,
        // then includes the delete (as containerd's CRI does), and RemoveContainer only
        // drops records. A shim that does not answer delays the record by at most the bound.
        match tokio::time::timeout(
            TASK_DELETE_WAIT,
            self.containerd.delete_task(container.id()),
        )
        .await
        {
            Ok(Ok(_)) => container.mark_task_deleted(),
            Ok(Err(e)) => {
                tracing::warn!(container = %container.id(), error = %e, "deleting the exited task failed");
            }
            Err(_) => {
                tracing::warn!(container = %container.id(), "deleting the exited task timed out");
            }
        }
        let code = code as i32;
        let reason = exit_reason(code, container.oom_killed());
        crate::metrics::metrics().container_exited(reason);
        container.update_status(|s| {
            s.state = ContainerState::Exited;
            s.exit_code = code;
            // The exit may be stamped before crius noted the start.
            s.finished_at = unix_nanos(at).max(s.started_at);
            s.reason = reason.to_string();
            s.pid = 0;
        });
        tracing::info!(container = %container.id(), exit_code = code, reason, "container exited");
        self.emit_container_event(
            container.id(),
            &container.metadata.sandbox_id,
            crate::api::v1::ContainerEventType::ContainerStoppedEvent,
        );
    }

    /// Stops a running container: its stop signal, up to `timeout`, then SIGKILL. Returns
    /// once it has exited.
    pub(crate) async fn stop_container_process(
        &self,
        container: &Arc<Container>,
        timeout: Duration,
    ) -> Result<(), Status> {
        if container.status().state != ContainerState::Running {
            return Ok(());
        }
        let id = container.id().to_string();
        if !timeout.is_zero() {
            let signal = stop_signal(&container.metadata.stop_signal);
            self.containerd
                .kill_task(&id, "", signal as u32, false)
                .await
                .map_err(internal)?;
            // As containerd's CRI: a client whose deadline comes before the stop timeout
            // ends gives the stop up there, before SIGKILL; the container runs on.
            // A timeout no clock can hold ends with the client's deadline or never.
            let grace_end = tokio::time::Instant::now().checked_add(timeout);
            let give_up =
                crate::cri::deadline::current().filter(|at| grace_end.is_none_or(|end| *at < end));
            let exited = match give_up.or(grace_end) {
                Some(at) => tokio::time::timeout_at(at, container.wait_exited())
                    .await
                    .is_ok(),
                None => {
                    container.wait_exited().await;
                    true
                }
            };
            if exited {
                return Ok(());
            }
            if give_up.is_some() {
                return Err(Status::deadline_exceeded(format!(
                    "container {id} did not stop before the client's deadline, which came \
                     before its stop timeout of {timeout:?}: it was not killed"
                )));
            }
            tracing::info!(container = %id, ?timeout, "container did not stop in time; killing it");
        }
        self.containerd
            .kill_task(&id, "", nix::sys::signal::Signal::SIGKILL as u32, true)
            .await
            .map_err(internal)?;
        if tokio::time::timeout(super::sandbox::KILL_WAIT, container.wait_exited())
            .await
            .is_err()
        {
            // The exit event may have been lost: ask containerd.
            match self.containerd.task_state(&id).await.map_err(internal)? {
                Some(task) if task.exit.is_none() => {
                    return Err(Status::deadline_exceeded(format!(
                        "container {id} did not exit after SIGKILL"
                    )));
                }
                Some(task) => {
                    let exit = task
                        .exit
                        .map(|e| (e.code, e.at))
                        .unwrap_or((137, SystemTime::now()));
                    self.handle_container_exit(container, exit.0, exit.1).await;
                }
                None => {
                    self.handle_container_exit(container, 137, SystemTime::now())
                        .await;
                }
            }
        }
        Ok(())
    }

    /// Deletes a container entirely: task, containerd record, snapshot, FIFOs and dirs,
    /// name. The log file stays (kubelet owns it). With [`Leftovers::InBackground`] the
    /// snapshot and files go after the answer (see [`Leftovers`]).
    pub(crate) async fn destroy_container(
        &self,
        container: &Arc<Container>,
        leftovers: Leftovers,
    ) -> Result<(), Status> {
        let id = container.id().to_string();
        if container.task_deleted() {
            self.unmount_idmapped_rootfs(&id);
        } else {
            self.destroy_task(&id).await?;
        }
        self.containerd
            .delete_container(&id)
            .await
            .map_err(internal)?;
        crate::failpoint::hit("container_remove_after_record")
            .await
            .map_err(internal)?;
        let sandbox = match leftovers {
            Leftovers::Wait => None,
            Leftovers::InBackground => self
                .sandboxes
                .get(&container.metadata.sandbox_id)
                .ok()
                .flatten(),
        };
        match sandbox {
            Some(sandbox) => {
                let (service, container) = (self.clone(), container.clone());
                sandbox.container_cleanups.spawn(async move {
                    let cleaned = match crate::failpoint::hit("container_cleanup").await {
                        Ok(()) => service.remove_container_leftovers(&container).await,
                        Err(e) => Err(internal(e)),
                    };
                    if let Err(e) = cleaned {
                        tracing::warn!(container = %container.id(), error = %e.message(), "removing a removed container's snapshot or files failed; the next start removes them");
                    }
                });
            }
            None => self.remove_container_leftovers(container).await?,
        }
        self.containers.remove(&id);
        self.container_names.release(&container.metadata.name, &id);
        self.emit_container_event(
            &id,
            &container.metadata.sandbox_id,
            crate::api::v1::ContainerEventType::ContainerDeletedEvent,
        );
        Ok(())
    }

    /// Removes the snapshot and then the files of a container whose containerd record is
    /// gone. The directories go last: while they stand, the sweep at start-up finds the
    /// container and removes its snapshot. Each step is idempotent, so a retry finishes
    /// what is left.
    async fn remove_container_leftovers(&self, container: &Arc<Container>) -> Result<(), Status> {
        self.containerd
            .remove_snapshot(
                self.snapshotter_of(&container.metadata.snapshotter),
                container.id(),
            )
            .await
            .map_err(internal)?;
        self.remove_container_files(container).await
    }

    /// Removes the container's FIFOs and directories, off the async threads.
    async fn remove_container_files(&self, container: &Arc<Container>) -> Result<(), Status> {
        let id = container.id();
        let dirs = [self.container_root_dir(id), self.container_state_dir(id)];
        let container = container.clone();
        tokio::task::spawn_blocking(move || {
            container.io.remove();
            for dir in dirs {
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(Status::internal(format!("removing {}: {e}", dir.display())));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Status::internal(format!("removing the container's files: {e}")))?
    }
}

/// When a removed container's writable layer and files go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftovers {
    /// Before the removal answers.
    Wait,
    /// Right after it answers, tracked by the pod (RemovePodSandbox waits for them): the
    /// container is gone for every caller once its containerd record is. A crash in
    /// between leaves the directories, and the sweep at start-up removes them with the
    /// snapshot (which containerd's garbage collection would also take, nothing refers
    /// to it any more).
    InBackground,
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    #[test]
    fn stop_signals_as_the_cri_enum() {
        use crate::api::v1::Signal as Cri;
        assert_eq!(cri_stop_signal(""), Cri::Sigterm);
        assert_eq!(cri_stop_signal("SIGUSR1"), Cri::Sigusr1);
        assert_eq!(cri_stop_signal("9"), Cri::Sigkill);
        assert_eq!(cri_stop_signal("rtmin+3"), Cri::Sigterm);
    }

    #[test]
    fn stop_signals_by_name_and_number() {
        assert_eq!(stop_signal(""), Signal::SIGTERM);
        assert_eq!(stop_signal("SIGINT"), Signal::SIGINT);
        assert_eq!(stop_signal("quit"), Signal::SIGQUIT);
        assert_eq!(stop_signal("9"), Signal::SIGKILL);
        assert_eq!(stop_signal("bogus"), Signal::SIGTERM);
    }

    #[test]
    fn exit_reasons() {
        assert_eq!(exit_reason(0, false), "Completed");
        assert_eq!(exit_reason(3, false), "Error");
        assert_eq!(exit_reason(137, true), "OOMKilled");
    }
}
