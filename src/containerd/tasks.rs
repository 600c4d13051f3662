//! Containers and tasks: the calls sandboxes and containers are made of.

use std::time::{Duration, SystemTime};

use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::snapshots::MountsRequest;
use containerd_client::services::v1::{
    CheckpointTaskRequest, CloseIoRequest, Container, CreateContainerRequest, CreateTaskRequest,
    DeleteContainerRequest, DeleteProcessRequest, DeleteTaskRequest, ExecProcessRequest,
    GetContainerRequest, GetRequest, KillRequest, ListContainersRequest, PauseTaskRequest,
    ResizePtyRequest, ResumeTaskRequest, StartRequest, UpdateContainerRequest, UpdateTaskRequest,
    WaitRequest,
};
use containerd_client::types::Mount;
use containerd_client::types::v1::Status as ProcessStatus;
use tonic::Code;

use super::content::leased;
use super::{Containerd, ContainerdError};

/// How a task process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: u32,
    pub at: SystemTime,
}

/// A task's state as containerd reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskState {
    pub pid: u32,
    pub status: ProcessStatus,
    pub exit: Option<ExitStatus>,
}

fn timestamp_to_system(ts: Option<prost_types::Timestamp>) -> SystemTime {
    ts.and_then(|t| {
        let secs = u64::try_from(t.seconds).ok()?;
        let nanos = u32::try_from(t.nanos).ok()?;
        Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
    })
    .unwrap_or_else(SystemTime::now)
}

fn not_found_is_ok<T: Default>(
    op: &'static str,
) -> impl FnOnce(tonic::Status) -> Result<T, ContainerdError> {
    move |status| {
        if status.code() == Code::NotFound {
            Ok(T::default())
        } else {
            Err(ContainerdError::Rpc { op, status })
        }
    }
}

impl Containerd {
    pub async fn create_container(
        &self,
        container: Container,
        lease: Option<&str>,
    ) -> Result<(), ContainerdError> {
        self.containers()
            .create(leased(
                CreateContainerRequest {
                    container: Some(container),
                },
                lease,
            ))
            .await
            .map_err(ContainerdError::rpc("create container"))?;
        Ok(())
    }

    pub async fn get_container(&self, id: &str) -> Result<Option<Container>, ContainerdError> {
        match self
            .containers()
            .get(GetContainerRequest { id: id.to_string() })
            .await
        {
            Ok(resp) => Ok(resp.into_inner().container),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "get container",
                status,
            }),
        }
    }

    /// Containers matching containerd filters (e.g. `labels."io.cri-containerd.kind"`).
    pub async fn list_containers(
        &self,
        filters: Vec<String>,
    ) -> Result<Vec<Container>, ContainerdError> {
        Ok(self
            .containers()
            .list(ListContainersRequest { filters })
            .await
            .map_err(ContainerdError::rpc("list containers"))?
            .into_inner()
            .containers)
    }

    /// Replaces the given extensions of a container record.
    pub async fn update_container_extensions(
        &self,
        id: &str,
        extensions: std::collections::HashMap<String, prost_types::Any>,
    ) -> Result<(), ContainerdError> {
        let paths = extensions
            .keys()
            .map(|k| format!("extensions.{k}"))
            .collect();
        self.containers()
            .update(UpdateContainerRequest {
                container: Some(Container {
                    id: id.to_string(),
                    extensions,
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            })
            .await
            .map_err(ContainerdError::rpc("update container"))?;
        Ok(())
    }

    /// Deletes a container record; a missing one is fine.
    pub async fn delete_container(&self, id: &str) -> Result<(), ContainerdError> {
        self.containers()
            .delete(DeleteContainerRequest { id: id.to_string() })
            .await
            .map(|_| ())
            .or_else(not_found_is_ok("delete container"))
    }

    pub async fn snapshot_mounts(
        &self,
        snapshotter: &str,
        key: &str,
    ) -> Result<Vec<Mount>, ContainerdError> {
        Ok(self
            .snapshots()
            .mounts(MountsRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            })
            .await
            .map_err(ContainerdError::rpc("snapshot mounts"))?
            .into_inner()
            .mounts)
    }

    /// Creates the task of container `id` on `rootfs`, with stdio at the given FIFO paths
    /// (empty: none). Returns the pid.
    pub async fn create_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        stdio: [&str; 3],
        terminal: bool,
    ) -> Result<u32, ContainerdError> {
        self.create_task_from(id, rootfs, stdio, terminal, None)
            .await
    }

    /// As [`Self::create_task`], with task `options` (the runtime's, for this task only:
    /// runc's `CriuImagePath` restores the process from a checkpoint).
    pub async fn create_task_from(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        stdio: [&str; 3],
        terminal: bool,
        options: Option<prost_types::Any>,
    ) -> Result<u32, ContainerdError> {
        let resp = self
            .tasks()
            .create(CreateTaskRequest {
                container_id: id.to_string(),
                rootfs,
                stdin: stdio[0].to_string(),
                stdout: stdio[1].to_string(),
                stderr: stdio[2].to_string(),
                terminal,
                options,
                ..Default::default()
            })
            .await
            .map_err(ContainerdError::rpc("create task"))?;
        Ok(resp.into_inner().pid)
    }

    /// Checkpoints a running task with runc's options (CRIU's images go to their
    /// `image_path`, not into the content store); the task keeps running unless they say
    /// `exit`.
    pub async fn checkpoint_task(
        &self,
        id: &str,
        options: prost_types::Any,
    ) -> Result<(), ContainerdError> {
        self.tasks()
            .checkpoint(CheckpointTaskRequest {
                container_id: id.to_string(),
                options: Some(options),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(ContainerdError::rpc("checkpoint task"))
    }

    /// Freezes a task's processes.
    pub async fn pause_task(&self, id: &str) -> Result<(), ContainerdError> {
        self.tasks()
            .pause(PauseTaskRequest {
                container_id: id.to_string(),
            })
            .await
            .map(|_| ())
            .map_err(ContainerdError::rpc("pause task"))
    }

    /// Thaws a paused task.
    pub async fn resume_task(&self, id: &str) -> Result<(), ContainerdError> {
        self.tasks()
            .resume(ResumeTaskRequest {
                container_id: id.to_string(),
            })
            .await
            .map(|_| ())
            .map_err(ContainerdError::rpc("resume task"))
    }

    /// Starts a task's init process (`exec_id` empty) or an exec process.
    pub async fn start_task(&self, id: &str, exec_id: &str) -> Result<u32, ContainerdError> {
        let resp = self
            .tasks()
            .start(StartRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            })
            .await
            .map_err(ContainerdError::rpc("start task"))?;
        Ok(resp.into_inner().pid)
    }

    /// Signals a process; a task that is gone is fine.
    pub async fn kill_task(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), ContainerdError> {
        self.tasks()
            .kill(KillRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                signal,
                all,
            })
            .await
            .map(|_| ())
            .or_else(not_found_is_ok("kill task"))
    }

    /// Waits for a process to exit.
    pub async fn wait_task(&self, id: &str, exec_id: &str) -> Result<ExitStatus, ContainerdError> {
        let resp = self
            .tasks()
            .wait(WaitRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            })
            .await
            .map_err(ContainerdError::rpc("wait task"))?
            .into_inner();
        Ok(ExitStatus {
            code: resp.exit_status,
            at: timestamp_to_system(resp.exited_at),
        })
    }

    /// Deletes a task (its process must have exited); `None` when there was no task.
    pub async fn delete_task(&self, id: &str) -> Result<Option<ExitStatus>, ContainerdError> {
        match self
            .tasks()
            .delete(DeleteTaskRequest {
                container_id: id.to_string(),
            })
            .await
        {
            Ok(resp) => {
                let resp = resp.into_inner();
                Ok(Some(ExitStatus {
                    code: resp.exit_status,
                    at: timestamp_to_system(resp.exited_at),
                }))
            }
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "delete task",
                status,
            }),
        }
    }

    /// The state of a task's init process; `None` when the container has no task.
    pub async fn task_state(&self, id: &str) -> Result<Option<TaskState>, ContainerdError> {
        match self
            .tasks()
            .get(GetRequest {
                container_id: id.to_string(),
                exec_id: String::new(),
            })
            .await
        {
            Ok(resp) => Ok(resp.into_inner().process.map(|p| {
                let status = ProcessStatus::try_from(p.status).unwrap_or(ProcessStatus::Unknown);
                TaskState {
                    pid: p.pid,
                    status,
                    exit: (status == ProcessStatus::Stopped).then(|| ExitStatus {
                        code: p.exit_status,
                        at: timestamp_to_system(p.exited_at),
                    }),
                }
            })),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "get task",
                status,
            }),
        }
    }
}

impl Containerd {
    /// Adds an exec process `exec_id` to container `id`'s task (not started yet).
    pub async fn exec_process(
        &self,
        id: &str,
        exec_id: &str,
        spec: prost_types::Any,
        stdio: [&str; 3],
        terminal: bool,
    ) -> Result<(), ContainerdError> {
        self.tasks()
            .exec(ExecProcessRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                stdin: stdio[0].to_string(),
                stdout: stdio[1].to_string(),
                stderr: stdio[2].to_string(),
                terminal,
                spec: Some(spec),
            })
            .await
            .map_err(ContainerdError::rpc("exec process"))?;
        Ok(())
    }

    /// Replaces a container record's spec and the given extensions in one update.
    pub async fn update_container_spec_and_extensions(
        &self,
        id: &str,
        spec: prost_types::Any,
        extensions: std::collections::HashMap<String, prost_types::Any>,
    ) -> Result<(), ContainerdError> {
        let mut paths = vec!["spec".to_string()];
        paths.extend(extensions.keys().map(|k| format!("extensions.{k}")));
        self.containers()
            .update(UpdateContainerRequest {
                container: Some(Container {
                    id: id.to_string(),
                    spec: Some(spec),
                    extensions,
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            })
            .await
            .map_err(ContainerdError::rpc("update container"))?;
        Ok(())
    }

    /// Applies new cgroup limits to a running task.
    pub async fn update_task_resources(
        &self,
        id: &str,
        resources: prost_types::Any,
    ) -> Result<(), ContainerdError> {
        self.tasks()
            .update(UpdateTaskRequest {
                container_id: id.to_string(),
                resources: Some(resources),
                annotations: Default::default(),
            })
            .await
            .map_err(ContainerdError::rpc("update task"))?;
        Ok(())
    }

    /// Closes the stdin of a task (empty `exec_id`) or exec process. The shim holds the
    /// stdin FIFO open itself, so closing crius's end alone never reaches the process as EOF.
    pub async fn close_stdin(&self, id: &str, exec_id: &str) -> Result<(), ContainerdError> {
        self.tasks()
            .close_io(CloseIoRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                stdin: true,
            })
            .await
            .map(|_| ())
            .or_else(not_found_is_ok("close stdin"))
    }

    /// Sets the terminal size of a task's (empty `exec_id`) or exec's console.
    pub async fn resize_pty(
        &self,
        id: &str,
        exec_id: &str,
        width: u32,
        height: u32,
    ) -> Result<(), ContainerdError> {
        self.tasks()
            .resize_pty(ResizePtyRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                width,
                height,
            })
            .await
            .map_err(ContainerdError::rpc("resize pty"))?;
        Ok(())
    }

    /// Deletes an exited exec process; a missing one is fine.
    pub async fn delete_process(&self, id: &str, exec_id: &str) -> Result<(), ContainerdError> {
        self.tasks()
            .delete_process(DeleteProcessRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            })
            .await
            .map(|_| ())
            .or_else(not_found_is_ok("delete process"))
    }
}

/// The runtime record of a containerd container: the shim type and its options.
pub fn runtime(name: &str, options: Option<prost_types::Any>) -> Option<Runtime> {
    Some(Runtime {
        name: name.to_string(),
        options,
    })
}
