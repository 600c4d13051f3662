//! `ExecSync`: run a command in a running container and return its output and exit code.
//! Output is captured up to 16 MiB per stream; on timeout the process is killed and the
//! call answers `DEADLINE_EXCEEDED`; after the process exits its output is drained for at
//! most a short while, so a background child that keeps the pipes open cannot hang it.

use std::sync::Arc;
use std::time::Duration;

use crate::api::v1::{ExecSyncRequest, ExecSyncResponse};
use tonic::Status;

use crate::cri::CriService;
use crate::io::{CapturedOutput, ExecIo};
use crate::store::{Container, ContainerState};

/// Output kept per stream.
const MAX_OUTPUT: usize = 16 * 1024 * 1024;
/// How long output may keep flowing after the process exited.
const EXEC_DRAIN: Duration = Duration::from_millis(500);
/// ...and after it was killed.
const KILLED_DRAIN: Duration = Duration::from_millis(50);
/// The type URL of an OCI process spec.
pub const PROCESS_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";

/// How long the output of an exited ExecSync process may keep flowing under a configured
/// `drain_exec_sync_io_timeout`: that long, or for zero, as long as the client's deadline
/// allows.
fn drain_limit(configured: Duration) -> Duration {
    if !configured.is_zero() {
        return configured;
    }
    crate::cri::deadline::current()
        .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
        .unwrap_or(Duration::MAX)
}

/// A fresh ID for an exec process.
pub(crate) fn new_exec_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl CriService {
    pub async fn exec_sync(&self, req: ExecSyncRequest) -> Result<ExecSyncResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        super::validate::exec_command(&req.cmd)?;
        if container.status().state != ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {} is not running",
                container.id()
            )));
        }
        // The timeout counts from the request, not from when the process got going.
        // A timeout beyond what a clock can hold is no deadline at all.
        let deadline = u64::try_from(req.timeout)
            .ok()
            .filter(|secs| *secs > 0)
            .and_then(|secs| tokio::time::Instant::now().checked_add(Duration::from_secs(secs)));
        self.run_exec_sync(&container, &req.cmd, deadline).await
    }

    async fn run_exec_sync(
        &self,
        container: &Arc<Container>,
        cmd: &[String],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<ExecSyncResponse, Status> {
        let id = container.id().to_string();
        let exec_id = new_exec_id();
        let dir = self.container_state_dir(&id).join("exec").join(&exec_id);
        let output = CapturedOutput::new(MAX_OUTPUT);
        let mut io = ExecIo::start(&dir, output.clone())
            .map_err(|e| Status::internal(format!("creating exec FIFOs: {e}")))?;
        if let Err(e) = self
            .create_exec_process(container, &exec_id, cmd, false, &io)
            .await
        {
            drop(io);
            return Err(self.exec_failure(&id, cmd, e).await);
        }
        let result = match self
            .start_and_wait_exec(&id, &exec_id, deadline, &mut io)
            .await
        {
            Err(e) if e.code() == tonic::Code::DeadlineExceeded => Err(Status::deadline_exceeded(
                format!("command {cmd:?} {}", e.message()),
            )),
            Err(e) if e.code() == tonic::Code::Internal => {
                Err(self.exec_failure(&id, cmd, e.message().to_string()).await)
            }
            other => other,
        };
        // A killed process has nothing more to say: do not wait for its output.
        let configured = self.config.drain_exec_sync_io_timeout;
        let drain = match (&result, configured) {
            (Err(_), _) => KILLED_DRAIN,
            (Ok(_), None) => EXEC_DRAIN,
            (Ok(_), Some(limit)) => drain_limit(limit),
        };
        let drained = io.finish(drain).await;
        self.delete_exec_process_later(id, exec_id.clone());
        let exit_code = result?;
        if !drained && configured.is_some() {
            // containerd's CRI words it so; kubelet and tools match the words. Not
            // DEADLINE_EXCEEDED: the command ended in time, and clients (kubelet's CRI client
            // among them) read that code as the command's own timeout.
            return Err(Status::failed_precondition(format!(
                "failed to drain exec process {exec_id:?} io in {drain:?} because io is still \
                 held by other processes (a background child of {cmd:?} keeps its output open)"
            )));
        }
        let (stdout, stderr) = output.take();
        Ok(ExecSyncResponse {
            stdout,
            stderr,
            exit_code,
        })
    }

    /// The answer for an exec that could not be made or started: the container stopped (or
    /// was paused, frozen by a stop in progress, or removed) under it, the command cannot
    /// run in it, or a server error.
    async fn exec_failure(&self, id: &str, cmd: &[String], error: String) -> Status {
        if super::runtime_errors::killed_while_starting(&error) {
            return Status::failed_precondition(format!(
                "the exec in container {id} was killed as it started (the container is \
                 stopping, or out of memory): {error}"
            ));
        }
        if super::runtime_errors::frozen(&error) || !self.task_runs(id).await {
            return Status::failed_precondition(format!("container {id} is not running: {error}"));
        }
        if super::runtime_errors::unexecutable(&error) {
            return Status::invalid_argument(format!(
                "command {cmd:?} cannot run in container {id}: {error}"
            ));
        }
        Status::internal(error)
    }

    /// Creates (does not start) exec process `exec_id` in the container: its process
    /// settings with `cmd`, on the FIFOs of `io`.
    pub(crate) async fn create_exec_process(
        &self,
        container: &Container,
        exec_id: &str,
        cmd: &[String],
        tty: bool,
        io: &ExecIo,
    ) -> Result<(), String> {
        let id = container.id();
        let mut process: serde_json::Value = serde_json::from_slice(&container.process_spec)
            .map_err(|e| format!("reading the container's process spec: {e}"))?;
        process["args"] = serde_json::json!(cmd);
        process["terminal"] = serde_json::json!(tty);
        let spec = prost_types::Any {
            type_url: PROCESS_TYPE_URL.to_string(),
            value: serde_json::to_vec(&process)
                .map_err(|e| format!("encoding the process spec: {e}"))?,
        };
        let stdio = io.fifos().paths();
        self.containerd
            .exec_process(id, exec_id, spec, [&stdio[0], &stdio[1], &stdio[2]], tty)
            .await
            .map_err(|e| format!("exec in container {id}: {e}"))
    }

    /// Deletes a finished exec process in the background: the shim's delete waits up to
    /// 2 s for output still held open by a background child, which no caller should wait
    /// for.
    pub(crate) fn delete_exec_process_later(&self, id: String, exec_id: String) {
        let containerd = self.containerd.clone();
        tokio::spawn(async move {
            if let Err(e) = containerd.delete_process(&id, &exec_id).await {
                tracing::warn!(container = %id, exec = %exec_id, error = %e, "deleting the exec process failed");
            }
        });
    }

    /// Starts the exec process and waits for it, killing it when the deadline passes.
    async fn start_and_wait_exec(
        &self,
        id: &str,
        exec_id: &str,
        deadline: Option<tokio::time::Instant>,
        io: &mut ExecIo,
    ) -> Result<i32, Status> {
        // The wait is in flight while the process starts, as containerd's CRI does: its exit
        // then comes back without another round trip once runc's exec returns. A wait that
        // answers first (a command quicker than the start's reply) is kept.
        let mut wait = std::pin::pin!(self.containerd.wait_task(id, exec_id));
        let mut start = std::pin::pin!(self.containerd.start_task(id, exec_id));
        let (started, early_exit) = tokio::select! {
            started = &mut start => (started, None),
            waited = &mut wait => (start.await, Some(waited)),
        };
        started.map_err(|e| Status::internal(format!("starting exec in container {id}: {e}")))?;
        // The shim opens an exec's FIFOs when it starts the process.
        io.process_created();
        let waited = match (early_exit, deadline) {
            (Some(waited), _) => waited,
            (None, None) => wait.await,
            (None, Some(deadline)) => match tokio::time::timeout_at(deadline, wait).await {
                Ok(waited) => waited,
                Err(_) => {
                    self.kill_timed_out_exec(id, exec_id).await;
                    return Err(Status::deadline_exceeded("timed out"));
                }
            },
        };
        let exit = waited.map_err(|e| Status::internal(format!("waiting for exec: {e}")))?;
        Ok(exit.code as i32)
    }

    /// Kills an exec past its deadline and gives it a moment to go.
    async fn kill_timed_out_exec(&self, id: &str, exec_id: &str) {
        let _ = self
            .containerd
            .kill_task(id, exec_id, nix::sys::signal::Signal::SIGKILL as u32, false)
            .await;
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.containerd.wait_task(id, exec_id),
        )
        .await;
    }
}
