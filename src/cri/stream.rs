//! `Exec`, `Attach` and `PortForward`: validate, store the request under a token, answer
//! with the stream server's URL. The stream server then calls back into the
//! [`StreamRuntime`] implemented here to run the exec, attach or connect.

use std::sync::Arc;
use std::time::Duration;

use crate::api::v1::{
    AttachRequest, AttachResponse, ExecRequest, ExecResponse, PortForwardRequest,
    PortForwardResponse,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::container_execsync::new_exec_id;
use super::sandbox::is_host_network;
use crate::cri::CriService;
use crate::io::{ExecIo, OutputChunk, Stream};
use crate::store::{Container, ContainerState, SandboxState};
use crate::streaming::input::Input;
use crate::streaming::{
    ProcessIo, RuntimeError, StreamRequest, StreamRuntime, TerminalSize, TokenError,
};

/// How long exec output may keep flowing after the process exited.
const EXEC_DRAIN: Duration = Duration::from_millis(500);
/// How long a killed exec gets to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long connecting to a pod port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl CriService {
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        super::validate::exec_command(&req.cmd)?;
        validate_stdio(req.stdin, req.stdout, req.stderr, req.tty)?;
        require_running(&container)?;
        let url = self.stream_url("exec", StreamRequest::Exec(req))?;
        Ok(ExecResponse { url })
    }

    pub async fn attach(&self, req: AttachRequest) -> Result<AttachResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        validate_stdio(req.stdin, req.stdout, req.stderr, req.tty)?;
        require_running(&container)?;
        if req.stdin && !container.metadata.config.stdin {
            return Err(Status::invalid_argument(format!(
                "container {} was not created with stdin",
                container.id()
            )));
        }
        let url = self.stream_url("attach", StreamRequest::Attach(req))?;
        Ok(AttachResponse { url })
    }

    pub async fn port_forward(
        &self,
        req: PortForwardRequest,
    ) -> Result<PortForwardResponse, Status> {
        let sandbox = self.find_sandbox(&req.pod_sandbox_id)?.ok_or_else(|| {
            Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
        })?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(Status::failed_precondition(format!(
                "pod sandbox {} is not ready",
                sandbox.id()
            )));
        }
        if let Some(port) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(Status::invalid_argument(format!("invalid port {port}")));
        }
        let req = PortForwardRequest {
            pod_sandbox_id: sandbox.id(),
            ..req
        };
        let url = self.stream_url("portforward", StreamRequest::PortForward(req))?;
        Ok(PortForwardResponse { url })
    }

    /// Stores the request and builds its URL.
    fn stream_url(&self, kind: &str, request: StreamRequest) -> Result<String, Status> {
        let base = &self
            .stream_endpoint
            .get()
            .ok_or_else(|| Status::unavailable("the stream server is not running yet"))?
            .base_url;
        let token = self.stream_requests.insert(request).map_err(|e| match e {
            TokenError::Exhausted => Status::resource_exhausted(e.to_string()),
        })?;
        Ok(format!("{base}/{kind}/{token}"))
    }

    fn running_container(&self, id: &str) -> Result<Arc<Container>, RuntimeError> {
        let container = self
            .require_container(id)
            .map_err(|e| RuntimeError::new(e.message()))?;
        require_running(&container).map_err(|e| RuntimeError::new(e.message()))?;
        Ok(container)
    }

    async fn run_streaming_exec(
        &self,
        container: &Arc<Container>,
        cmd: &[String],
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<i32, RuntimeError> {
        let id = container.id().to_string();
        let exec_id = new_exec_id();
        let dir = self.container_state_dir(&id).join("exec").join(&exec_id);
        let ProcessIo {
            stdin,
            stdout,
            stderr,
            tty,
            resize,
        } = io;
        let mut exec_io = ExecIo::start_streams(&dir, stdin.is_some(), tty, stdout, stderr)
            .map_err(|e| RuntimeError::new(format!("creating exec FIFOs: {e}")))?;

        self.create_exec_process(container, &exec_id, cmd, tty, &exec_io)
            .await
            .map_err(RuntimeError::new)?;
        let outcome = self
            .start_and_wait_streaming(&id, &exec_id, &mut exec_io, stdin, resize, cancel)
            .await;
        exec_io.finish(EXEC_DRAIN).await;
        self.delete_exec_process_later(id, exec_id);
        outcome
    }

    async fn start_and_wait_streaming(
        &self,
        id: &str,
        exec_id: &str,
        exec_io: &mut ExecIo,
        stdin: Option<Input>,
        resize: Option<mpsc::Receiver<TerminalSize>>,
        cancel: CancellationToken,
    ) -> Result<i32, RuntimeError> {
        self.containerd
            .start_task(id, exec_id)
            .await
            .map_err(|e| RuntimeError::new(format!("starting exec in container {id}: {e}")))?;
        // The shim opened the FIFOs when it started the process.
        exec_io.process_created();
        let _stdin_copier = match (stdin, exec_io.take_stdin()) {
            (Some(input), Some(fifo)) => Some(Aborting(tokio::spawn(copy_stdin(
                self.clone(),
                id.to_string(),
                exec_id.to_string(),
                input,
                fifo,
            )))),
            _ => None,
        };
        let _resizer = resize.map(|sizes| {
            Aborting(tokio::spawn(apply_resizes(
                self.clone(),
                id.to_string(),
                exec_id.to_string(),
                sizes,
            )))
        });
        tokio::select! {
            waited = self.containerd.wait_task(id, exec_id) => {
                let exit = waited.map_err(|e| RuntimeError::new(format!("waiting for exec: {e}")))?;
                Ok(exit.code as i32)
            }
            _ = cancel.cancelled() => {
                tracing::debug!(container = id, exec = exec_id, "client went away; killing the exec");
                let _ = self
                    .containerd
                    .kill_task(id, exec_id, nix::sys::signal::Signal::SIGKILL as u32, false)
                    .await;
                let _ = tokio::time::timeout(KILL_WAIT, self.containerd.wait_task(id, exec_id)).await;
                Err(RuntimeError::new("the client went away"))
            }
        }
    }

    async fn run_attach(
        &self,
        container: &Arc<Container>,
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<(), RuntimeError> {
        let ProcessIo {
            stdin,
            stdout,
            stderr,
            tty,
            resize,
        } = io;
        // Subscribe first so nothing printed from here on is missed.
        let mut output = container.io.subscribe();
        let _stdin_copier = stdin.map(|input| {
            Aborting(tokio::spawn(attach_stdin(
                self.clone(),
                container.clone(),
                input,
            )))
        });
        let _resizer = resize.filter(|_| tty).map(|sizes| {
            Aborting(tokio::spawn(apply_resizes(
                self.clone(),
                container.id().to_string(),
                String::new(),
                sizes,
            )))
        });
        let deliver = |chunk: OutputChunk| {
            let target = match chunk.stream {
                Stream::Stdout => stdout.clone(),
                Stream::Stderr => stderr.clone(),
            };
            async move {
                if let Some(target) = target {
                    // A client that stopped reading one stream still gets the rest.
                    let _ = target.write(chunk.data).await;
                }
            }
        };
        loop {
            tokio::select! {
                chunk = output.recv() => match chunk {
                    Ok(chunk) => deliver(chunk).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(container = %container.id(), missed, "attach fell behind; output skipped");
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = container.wait_exited() => {
                    // The output was drained before the exit was recorded: pass on the rest.
                    while let Ok(chunk) = output.try_recv() {
                        deliver(chunk).await;
                    }
                    break;
                }
                _ = cancel.cancelled() => break,
            }
        }
        Ok(())
    }

    /// Connects to `port` on the sandbox's loopback, IPv4 first.
    async fn connect_in_sandbox(
        &self,
        sandbox_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, RuntimeError> {
        let sandbox = self
            .find_sandbox(sandbox_id)
            .map_err(|e| RuntimeError::new(e.message()))?
            .ok_or_else(|| RuntimeError::new(format!("pod sandbox {sandbox_id:?} not found")))?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(RuntimeError::new(format!(
                "pod sandbox {sandbox_id} is not ready"
            )));
        }
        let metadata = sandbox.metadata();
        let netns = (!is_host_network(&metadata.config)).then(|| metadata.netns_path.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Entering a network namespace changes the calling thread for good: use a thread
        // of its own that ends right after; the socket stays in the pod's namespace.
        std::thread::Builder::new()
            .name("crius-portfwd".into())
            .spawn(move || {
                let _ = tx.send(connect_loopback(netns.as_deref(), port));
            })
            .map_err(|e| RuntimeError::new(format!("starting the connect thread: {e}")))?;
        let stream = rx
            .await
            .map_err(|_| RuntimeError::new("the connect thread died"))?
            .map_err(RuntimeError::new)?;
        stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
            .map_err(|e| RuntimeError::new(format!("using the connection: {e}")))
    }
}

/// The CRI's rules for the stdio flags of Exec and Attach.
fn validate_stdio(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Result<(), Status> {
    if tty && stderr {
        return Err(Status::invalid_argument(
            "tty and stderr cannot both be true",
        ));
    }
    if !stdin && !stdout && !stderr {
        return Err(Status::invalid_argument(
            "one of stdin, stdout, or stderr must be set",
        ));
    }
    Ok(())
}

fn require_running(container: &Container) -> Result<(), Status> {
    if container.status().state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            container.id()
        )));
    }
    Ok(())
}

/// Connects to `localhost:port`, inside `netns` when given. Runs on its own thread.
fn connect_loopback(netns: Option<&str>, port: u16) -> Result<std::net::TcpStream, String> {
    if let Some(path) = netns {
        crate::sys::netns::enter_on_this_thread(std::path::Path::new(path))
            .map_err(|e| e.to_string())?;
    }
    let v4 = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    match std::net::TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(stream) => Ok(stream),
        Err(v4_error) => std::net::TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT)
            .map_err(|_| format!("connecting to localhost:{port}: {v4_error}")),
    }
}

/// Aborts a helper task when its exec or attach ends.
struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Client stdin into an exec's stdin FIFO; when the client closes its stdin, so does the
/// process's.
async fn copy_stdin(
    service: CriService,
    id: String,
    exec_id: String,
    mut input: Input,
    mut fifo: tokio::net::unix::pipe::Sender,
) {
    while let Some(data) = input.recv().await {
        tracing::trace!(exec = %exec_id, bytes = data.len(), head = ?&data[..data.len().min(8)], "exec stdin");
        if let Err(e) = fifo.write_all(&data).await {
            tracing::debug!(error = %e, "exec stdin closed");
            return;
        }
    }
    drop(fifo);
    if let Err(e) = service.containerd.close_stdin(&id, &exec_id).await {
        tracing::debug!(container = %id, exec = %exec_id, error = %e, "closing exec stdin failed");
    }
}

/// Client stdin into the container's stdin. With `stdin_once` the container's stdin closes
/// when this client's does.
async fn attach_stdin(service: CriService, container: Arc<Container>, mut input: Input) {
    while let Some(data) = input.recv().await {
        match container.io.write_stdin(&data).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::debug!(container = %container.id(), error = %e, "container stdin closed");
                return;
            }
        }
    }
    if container.metadata.config.stdin_once {
        container.io.close_stdin().await;
        if let Err(e) = service.containerd.close_stdin(container.id(), "").await {
            tracing::debug!(container = %container.id(), error = %e, "closing container stdin failed");
        }
    }
}

async fn apply_resizes(
    service: CriService,
    id: String,
    exec_id: String,
    mut sizes: mpsc::Receiver<TerminalSize>,
) {
    while let Some(size) = sizes.recv().await {
        if let Err(e) = service
            .containerd
            .resize_pty(&id, &exec_id, u32::from(size.width), u32::from(size.height))
            .await
        {
            tracing::debug!(container = %id, exec = %exec_id, error = %e, "resizing the terminal failed");
        }
    }
}

#[async_trait::async_trait]
impl StreamRuntime for CriService {
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<i32, RuntimeError> {
        let container = self.running_container(container_id)?;
        self.run_streaming_exec(&container, cmd, io, cancel).await
    }

    async fn attach(
        &self,
        container_id: &str,
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<(), RuntimeError> {
        let container = self.running_container(container_id)?;
        self.run_attach(&container, io, cancel).await
    }

    async fn port_forward(
        &self,
        sandbox_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, RuntimeError> {
        self.connect_in_sandbox(sandbox_id, port).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_flags_follow_the_cri_rules() {
        assert!(validate_stdio(false, true, false, false).is_ok());
        assert!(validate_stdio(true, true, false, true).is_ok());
        assert_eq!(
            validate_stdio(false, true, true, true).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            validate_stdio(false, false, false, false)
                .unwrap_err()
                .code(),
            tonic::Code::InvalidArgument
        );
    }
}
