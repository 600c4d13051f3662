//! Reacting to task exits reported by the event monitor: a container's exit is recorded
//! (code, time, reason, drained output); a pause task that exits makes its sandbox NOTREADY.
//! Either way the task is deleted, as containerd's CRI does.

use super::record::UNKNOWN_EXIT_CODE;
use containerd_client::types::v1::Status as ProcessStatus;

use std::sync::Arc;
use std::time::SystemTime;

use crate::cri::CriService;
use crate::cri::events::{TaskExitEvent, TaskExitHandler};
use crate::store::{Container, ContainerState, SandboxState};

#[async_trait::async_trait]
impl TaskExitHandler for CriService {
    async fn task_exited(&self, event: TaskExitEvent) {
        // Exec processes end on their own terms (ExecSync waits for them).
        if event.id != event.container_id {
            return;
        }
        tracing::debug!(container = %event.container_id, code = event.exit_status, "task exit event");
        if let Ok(Some(container)) = self.containers.get(&event.container_id)
            && container.id() == event.container_id
        {
            self.record_exit_later(container, event.exit_status, event.exited_at);
            return;
        }
        let Ok(Some(sandbox)) = self.sandboxes.get(&event.container_id) else {
            return;
        };
        if sandbox.id() != event.container_id {
            return;
        }
        tracing::info!(sandbox = %event.container_id, exit_status = event.exit_status, "pause task exited");
        let was_ready = sandbox.status().state == SandboxState::Ready;
        sandbox.update_status(|s| {
            // A sandbox still being created learns of it this way, and fails.
            if matches!(s.state, SandboxState::Ready | SandboxState::Creating) {
                s.state = SandboxState::NotReady;
            }
            s.pid = 0;
        });
        if was_ready {
            self.emit_container_event(
                &event.container_id,
                &event.container_id,
                crate::api::v1::ContainerEventType::ContainerStoppedEvent,
            );
        }
        // Deleting the task may wait on the shim: do it off the event loop, and not while a
        // Stop or Remove of the sandbox is deleting it too.
        let service = self.clone();
        tokio::spawn(async move {
            let _lifecycle = sandbox.lifecycle.lock().await;
            if let Err(e) = service.containerd.delete_task(&event.container_id).await {
                tracing::warn!(sandbox = %event.container_id, error = %e, "deleting the exited pause task failed");
            }
        });
    }

    async fn task_oom(&self, container_id: &str) {
        if let Ok(Some(container)) = self.containers.get(container_id)
            && container.id() == container_id
        {
            tracing::info!(container = %container_id, "container hit its memory limit");
            container.mark_oom_killed();
        }
    }

    fn containerd_reachable(&self, reachable: bool) {
        self.set_containerd_reachable(reachable);
    }

    async fn resync_tasks(&self) -> usize {
        let mut exited = Vec::new();
        let unchecked = self.recheck_tasks(&mut exited).await;
        // Recording an exit drains the container's output and deletes its task (seconds
        // when a shim is slow): each on its own, not one after another on the event loop.
        for (container, code, at) in exited {
            self.record_exit_later(container, code, at);
        }
        unchecked
    }
}

impl CriService {
    /// Records a container's exit in a task of its own, after any start, stop or removal in
    /// progress (a start records RUNNING first; a removed container is skipped).
    fn record_exit_later(&self, container: Arc<Container>, code: u32, at: SystemTime) {
        let service = self.clone();
        tokio::spawn(async move {
            drop(container.lifecycle.lock().await);
            if service
                .containers
                .get(container.id())
                .ok()
                .flatten()
                .is_some()
            {
                service.handle_container_exit(&container, code, at).await;
            }
        });
    }

    /// Asks containerd about every running container and ready sandbox (after the event
    /// stream broke): marks sandboxes whose pause task ended NOTREADY and collects the
    /// containers whose task ended in `exited`. Returns how many could not be asked.
    async fn recheck_tasks(&self, exited: &mut Vec<(Arc<Container>, u32, SystemTime)>) -> usize {
        let mut unchecked = 0;
        for container in self.containers.list() {
            // One being started, stopped or removed is settled by that operation.
            let Ok(_lifecycle) = container.lifecycle.try_lock() else {
                continue;
            };
            if container.status().state != ContainerState::Running {
                continue;
            }
            let state = self.containerd.task_state(container.id()).await;
            tracing::debug!(container = %container.id(), ?state, "re-checked task");
            match state {
                Ok(Some(task)) if task.status == ProcessStatus::Running => {}
                Ok(Some(task)) => {
                    let (code, at) = task
                        .exit
                        .map(|e| (e.code, e.at))
                        .unwrap_or((UNKNOWN_EXIT_CODE, SystemTime::now()));
                    exited.push((container.clone(), code, at));
                }
                Ok(None) => {
                    exited.push((container.clone(), UNKNOWN_EXIT_CODE, SystemTime::now()));
                }
                Err(e) => {
                    unchecked += 1;
                    tracing::warn!(container = %container.id(), error = %e, "cannot re-sync container task")
                }
            }
        }
        for sandbox in self.sandboxes.list() {
            let Ok(_lifecycle) = sandbox.lifecycle.try_lock() else {
                continue;
            };
            if sandbox.status().state != SandboxState::Ready {
                continue;
            }
            let id = sandbox.id();
            match self.containerd.task_state(&id).await {
                Ok(Some(task)) if task.status == ProcessStatus::Running => {}
                Ok(_) => {
                    sandbox.update_status(|s| {
                        if s.state == SandboxState::Ready {
                            s.state = SandboxState::NotReady;
                        }
                    });
                }
                Err(e) => {
                    unchecked += 1;
                    tracing::warn!(sandbox = %id, error = %e, "cannot re-sync sandbox task")
                }
            }
        }
        unchecked
    }
}
