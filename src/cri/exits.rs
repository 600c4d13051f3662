//! Reacting to task exits reported by the event monitor: a pause task that exits makes its
//! sandbox NOTREADY (and its task is deleted, as containerd's CRI does).

use containerd_client::types::v1::Status as ProcessStatus;

use crate::events::{TaskExitEvent, TaskExitHandler};
use crate::server::CriService;
use crate::store::SandboxState;

#[async_trait::async_trait]
impl TaskExitHandler for CriService {
    async fn task_exited(&self, event: TaskExitEvent) {
        // Exec processes of containers are not sandboxes' concern.
        if event.id != event.container_id {
            return;
        }
        let Ok(Some(sandbox)) = self.sandboxes.get(&event.container_id) else {
            return;
        };
        if sandbox.id() != event.container_id {
            return;
        }
        tracing::info!(sandbox = %event.container_id, exit_status = event.exit_status, "pause task exited");
        sandbox.update_status(|s| {
            if s.state == SandboxState::Ready {
                s.state = SandboxState::NotReady;
            }
            s.pid = 0;
        });
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

    async fn resync_tasks(&self) {
        for sandbox in self.sandboxes.list() {
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
                Err(e) => tracing::warn!(sandbox = %id, error = %e, "cannot re-sync sandbox task"),
            }
        }
    }
}
