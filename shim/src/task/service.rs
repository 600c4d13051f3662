//! The ttrpc task service (`containerd.task.v2.Task`, and the same as `v3`): each verb reads
//! its request, calls the shim, and answers.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim_protos::api::{
    CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest,
    CreateTaskResponse, DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest,
    PauseRequest, PidsRequest, PidsResponse, ProcessInfo, ResizePtyRequest, ResumeRequest,
    ShutdownRequest, StartRequest, StartResponse, StateRequest, StateResponse, StatsRequest,
    StatsResponse, UpdateTaskRequest, WaitRequest, WaitResponse,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageDyn};
use containerd_shim_protos::shim::oci::{CheckpointOptions, Options, ProcessDetails};
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::ttrpc;
use containerd_shim_protos::ttrpc::r#async::TtrpcContext;

use crate::error::ShimError;
use crate::runtime::runc::{CheckpointFlags, RuncOptions};
use crate::task::create::CreateRequest;
use crate::task::shim::{Shim, timestamp};
use crate::task::stdio::StdioPaths;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone)]
pub struct TaskService(pub Arc<Shim>);

type Answer<T> = ttrpc::Result<T>;

/// Logs one line per call, with its latency and error (a success at debug level).
async fn logged<T>(
    method: &str,
    id: &str,
    call: impl std::future::Future<Output = Result<T, ShimError>>,
) -> Answer<T> {
    logged_at(log::Level::Debug, method, id, call).await
}

/// Logs one line per call: a success at `level`, a failure one level up.
pub(crate) async fn logged_at<T>(
    level: log::Level,
    method: &str,
    id: &str,
    call: impl std::future::Future<Output = Result<T, ShimError>>,
) -> Answer<T> {
    let started = std::time::Instant::now();
    let result = call.await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match &result {
        Ok(_) => log::log!(level, "{method} {id} ({ms:.1} ms)"),
        Err(e) => {
            let up = if level == log::Level::Debug {
                log::Level::Info
            } else {
                log::Level::Warn
            };
            log::log!(up, "{method} {id} failed ({ms:.1} ms): {e}");
        }
    }
    result.map_err(Into::into)
}

/// Decodes an Any when its type is `expected`; other types (or none) give None.
fn decode_any<M: Message>(any: Option<&Any>, expected: &str) -> Result<Option<M>, ShimError> {
    let Some(any) = any else {
        return Ok(None);
    };
    if !any.type_url.ends_with(expected) {
        return Ok(None);
    }
    M::parse_from_bytes(&any.value)
        .map(Some)
        .map_err(|e| ShimError::InvalidArgument(format!("{expected}: {e}")))
}

fn any_of(message: &dyn MessageDyn) -> Result<Any, ShimError> {
    let mut any = Any::new();
    any.type_url = message.descriptor_dyn().full_name().to_string();
    any.value = message
        .write_to_bytes_dyn()
        .map_err(|e| ShimError::Internal(e.to_string()))?;
    Ok(any)
}

#[async_trait]
impl Task for TaskService {
    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> Answer<StateResponse> {
        logged("State", &req.id, async {
            let process = self.0.process(&req.id, &req.exec_id)?;
            let container = self.0.container(&req.id)?;
            let snapshot = process.snapshot();
            Ok(StateResponse {
                id: process.event_id().to_string(),
                bundle: container.bundle.display().to_string(),
                pid: snapshot.pid as u32,
                status: snapshot.status.into(),
                stdin: process.stdio.stdin.clone(),
                stdout: process.stdio.stdout.clone(),
                stderr: process.stdio.stderr.clone(),
                terminal: process.stdio.terminal,
                exit_status: snapshot.exit.map(|e| e.status).unwrap_or_default(),
                exited_at: snapshot.exit.map(|e| timestamp(e.at)).into(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            })
        })
        .await
    }

    async fn create(&self, _: &TtrpcContext, req: CreateTaskRequest) -> Answer<CreateTaskResponse> {
        logged("Create", &req.id, async {
            let options: Option<Options> =
                decode_any(req.options.as_ref(), "containerd.runc.v1.Options")?;
            // CRIU's images to restore from: containerd 2.x passes the task's CriuImagePath
            // as the checkpoint; 1.6 leaves it in the options for a shim not named runc.
            let checkpoint = Some(req.checkpoint.clone())
                .filter(|c| !c.is_empty())
                .or_else(|| {
                    options
                        .as_ref()
                        .map(|o| o.criu_image_path.clone())
                        .filter(|c| !c.is_empty())
                })
                .map(std::path::PathBuf::from);
            let runc = options
                .map(|o| RuncOptions {
                    binary: o.binary_name,
                    root: o.root,
                    systemd_cgroup: o.systemd_cgroup,
                    no_pivot_root: o.no_pivot_root,
                    no_new_keyring: o.no_new_keyring,
                })
                .unwrap_or_default();
            let pid = self
                .0
                .create(CreateRequest {
                    id: req.id.clone(),
                    bundle: req.bundle.clone().into(),
                    rootfs: req.rootfs.clone(),
                    stdio: StdioPaths {
                        stdin: req.stdin.clone(),
                        stdout: req.stdout.clone(),
                        stderr: req.stderr.clone(),
                        terminal: req.terminal,
                    },
                    runc,
                    checkpoint,
                })
                .await?;
            Ok(CreateTaskResponse {
                pid: pid as u32,
                ..Default::default()
            })
        })
        .await
    }

    async fn start(&self, _: &TtrpcContext, req: StartRequest) -> Answer<StartResponse> {
        logged("Start", &req.id, async {
            let pid = self.0.start(&req.id, &req.exec_id).await?;
            Ok(StartResponse {
                pid: pid as u32,
                ..Default::default()
            })
        })
        .await
    }

    async fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> Answer<DeleteResponse> {
        logged("Delete", &req.id, async {
            let (pid, exit) = self.0.delete(&req.id, &req.exec_id).await?;
            Ok(DeleteResponse {
                pid: pid as u32,
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            })
        })
        .await
    }

    async fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> Answer<PidsResponse> {
        logged("Pids", &req.id, async {
            let mut processes = Vec::new();
            for (pid, exec_id) in self.0.pids(&req.id).await? {
                let info = match exec_id {
                    Some(exec_id) => Some(any_of(&ProcessDetails {
                        exec_id,
                        ..Default::default()
                    })?),
                    None => None,
                };
                processes.push(ProcessInfo {
                    pid,
                    info: info.into(),
                    ..Default::default()
                });
            }
            Ok(PidsResponse {
                processes,
                ..Default::default()
            })
        })
        .await
    }

    async fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> Answer<Empty> {
        logged("Pause", &req.id, async {
            self.0.pause(&req.id).await.map(|()| Empty::new())
        })
        .await
    }

    async fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> Answer<Empty> {
        logged("Resume", &req.id, async {
            self.0.resume(&req.id).await.map(|()| Empty::new())
        })
        .await
    }

    async fn checkpoint(&self, _: &TtrpcContext, req: CheckpointTaskRequest) -> Answer<Empty> {
        logged("Checkpoint", &req.id, async {
            let options: CheckpointOptions =
                decode_any(req.options.as_ref(), "containerd.runc.v1.CheckpointOptions")?
                    .unwrap_or_default();
            let image_path = if options.image_path.is_empty() {
                req.path.clone()
            } else {
                options.image_path
            };
            if image_path.is_empty() {
                return Err(ShimError::InvalidArgument(
                    "checkpoint needs an image path".into(),
                ));
            }
            let flags = CheckpointFlags {
                image_path,
                work_path: options.work_path,
                leave_running: !options.exit,
                tcp_established: options.open_tcp,
                external_unix_sockets: options.external_unix_sockets,
                shell_job: options.terminal,
                file_locks: options.file_locks,
                empty_namespaces: options.empty_namespaces,
                cgroups_mode: options.cgroups_mode,
            };
            self.0
                .checkpoint(&req.id, flags)
                .await
                .map(|()| Empty::new())
        })
        .await
    }

    async fn kill(&self, _: &TtrpcContext, req: KillRequest) -> Answer<Empty> {
        logged("Kill", &req.id, async {
            self.0
                .kill(&req.id, &req.exec_id, req.signal, req.all)
                .await
                .map(|()| Empty::new())
        })
        .await
    }

    async fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> Answer<Empty> {
        logged("Exec", &req.id, async {
            let spec = req
                .spec
                .as_ref()
                .map(|s| s.value.as_slice())
                .ok_or_else(|| ShimError::InvalidArgument("exec without a process spec".into()))?;
            let stdio = StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
            };
            self.0
                .add_exec(&req.id, &req.exec_id, stdio, spec)
                .map(|()| Empty::new())
        })
        .await
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> Answer<Empty> {
        logged("ResizePty", &req.id, async {
            let process = self.0.process(&req.id, &req.exec_id)?;
            let width = u16::try_from(req.width).unwrap_or(u16::MAX);
            let height = u16::try_from(req.height).unwrap_or(u16::MAX);
            process
                .with_io(|io| io.resize(width, height))
                .map_err(|e| ShimError::FailedPrecondition(format!("resize: {e}")))?;
            Ok(Empty::new())
        })
        .await
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> Answer<Empty> {
        logged("CloseIO", &req.id, async {
            let process = self.0.process(&req.id, &req.exec_id)?;
            if req.stdin {
                process.with_io(|io| io.close_stdin());
            }
            Ok(Empty::new())
        })
        .await
    }

    async fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> Answer<Empty> {
        logged("Update", &req.id, async {
            let resources = req
                .resources
                .as_ref()
                .map(|r| r.value.clone())
                .ok_or_else(|| ShimError::InvalidArgument("update without resources".into()))?;
            self.0
                .update(&req.id, resources)
                .await
                .map(|()| Empty::new())
        })
        .await
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> Answer<WaitResponse> {
        logged("Wait", &req.id, async {
            let process = self.0.process(&req.id, &req.exec_id)?;
            let exit = process.wait().await;
            Ok(WaitResponse {
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            })
        })
        .await
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> Answer<StatsResponse> {
        logged("Stats", &req.id, async {
            let container = self.0.container(&req.id)?;
            let cgroup = container.cgroup.as_ref().ok_or_else(|| {
                ShimError::FailedPrecondition(format!("container {} has no cgroup", req.id))
            })?;
            let stats = crate::task::stats::collect(cgroup)?;
            Ok(StatsResponse {
                stats: Some(stats).into(),
                ..Default::default()
            })
        })
        .await
    }

    async fn connect(&self, _: &TtrpcContext, req: ConnectRequest) -> Answer<ConnectResponse> {
        logged("Connect", &req.id, async {
            Ok(ConnectResponse {
                shim_pid: std::process::id(),
                task_pid: self.0.init_pid(&req.id).max(0) as u32,
                version: VERSION.to_string(),
                ..Default::default()
            })
        })
        .await
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> Answer<Empty> {
        logged("Shutdown", &req.id, async {
            // Other containers of the pod keep the shim.
            if self.0.is_idle() {
                log::debug!("last container gone: shutting down");
                self.0.shutdown.notify_one();
            }
            Ok(Empty::new())
        })
        .await
    }
}
