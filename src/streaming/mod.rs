//! The HTTP stream server behind `Exec`, `Attach` and `PortForward`.
//!
//! The RPCs store their request under a single-use token ([`tokens`]) and answer with a URL
//! on this server; the client connects there and upgrades to SPDY/3.1 ([`spdy`]) or
//! WebSocket. The server speaks the Kubernetes stream protocols on top and asks a
//! [`StreamRuntime`] (the CRI service) to run the exec, attach to the container or connect
//! to the pod's port. See `STREAMING` in the docs for the wire protocol.

mod admission;
pub mod input;
mod peer;
mod portforward;
mod remotecommand;
mod server;
pub mod spdy;
mod status;
pub mod tokens;
mod websocket;

use std::sync::Arc;

use crate::api::v1::{AttachRequest, ExecRequest, PortForwardRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::io::AsyncOutput;
pub use server::{StreamEndpoint, StreamServer, StreamServerError};
pub use tokens::{TokenCache, TokenError};

/// A request waiting for its client.
#[derive(Debug, Clone)]
pub enum StreamRequest {
    Exec(ExecRequest),
    Attach(AttachRequest),
    PortForward(PortForwardRequest),
}

/// The tokens the RPCs hand out.
pub type StreamRequests = TokenCache<StreamRequest>;

/// A terminal size as clients send it on the resize stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The client's end of a process's stdio, whatever the transport.
pub struct ProcessIo {
    /// Input from the client; ends when the client closes stdin.
    pub stdin: Option<input::Input>,
    pub stdout: Option<Arc<dyn AsyncOutput>>,
    /// Never set together with `tty`.
    pub stderr: Option<Arc<dyn AsyncOutput>>,
    pub tty: bool,
    /// Terminal size changes, with `tty`.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

/// Why a stream request failed, as the client will read it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

impl RuntimeError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// What the stream server needs from the runtime.
#[async_trait::async_trait]
pub trait StreamRuntime: Send + Sync + 'static {
    /// Runs `cmd` in the container with `io` and returns its exit code. When `cancel` fires
    /// (the client went away) the process is killed.
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<i32, RuntimeError>;

    /// Connects `io` to the running container's own stdio until it exits or `cancel` fires.
    async fn attach(
        &self,
        container_id: &str,
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Result<(), RuntimeError>;

    /// Connects to `localhost:port` in the sandbox's network namespace.
    async fn port_forward(
        &self,
        sandbox_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, RuntimeError>;
}
