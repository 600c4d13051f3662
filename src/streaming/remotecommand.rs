//! exec and attach over SPDY: collect the streams the client opens, run the command, write
//! how it ended on the error stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::input::Input;
use super::spdy::{SpdyConnection, SpdyStream, StreamOutput, header};
use super::status::Outcome;
use super::{AsyncOutput, ProcessIo, StreamRuntime, TerminalSize};

/// How long the client has to open every stream it asked for.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Streams an exec or attach connection may have open: its five and a few the client may
/// open too early or in excess, which are refused later.
pub const MAX_STREAMS: usize = 8;

/// The `channel.k8s.io` protocol versions, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChannelProtocol {
    V1,
    V2,
    V3,
    V4,
    /// WebSocket only.
    V5,
}

impl ChannelProtocol {
    /// SPDY exec/attach protocols crius speaks, in the order it prefers them.
    pub const SPDY: [&'static str; 4] = [
        "v4.channel.k8s.io",
        "v3.channel.k8s.io",
        "v2.channel.k8s.io",
        "channel.k8s.io",
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "channel.k8s.io" => Some(Self::V1),
            "v2.channel.k8s.io" => Some(Self::V2),
            "v3.channel.k8s.io" => Some(Self::V3),
            "v4.channel.k8s.io" => Some(Self::V4),
            "v5.channel.k8s.io" => Some(Self::V5),
            _ => None,
        }
    }

    /// Whether the client sends terminal sizes (v3 on).
    pub fn resizes(self) -> bool {
        self >= Self::V3
    }

    /// The bytes to write on the error stream for `outcome`, if any.
    pub fn status_bytes(self, outcome: &Outcome) -> Option<Vec<u8>> {
        if self >= Self::V4 {
            Some(outcome.status_json())
        } else {
            outcome.legacy_message()
        }
    }
}

/// What the stored request asked for.
#[derive(Debug, Clone, Copy)]
pub struct StdioOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The command behind the streams.
#[derive(Debug, Clone)]
pub enum Command {
    Exec {
        container_id: String,
        cmd: Vec<String>,
    },
    Attach {
        container_id: String,
    },
}

impl Command {
    /// The session kind, as the metrics count it.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Exec { .. } => "exec",
            Command::Attach { .. } => "attach",
        }
    }

    /// Runs the command with `io` and says how it ended.
    pub async fn run(
        &self,
        runtime: &dyn StreamRuntime,
        io: ProcessIo,
        cancel: CancellationToken,
    ) -> Outcome {
        match self {
            Command::Exec { container_id, cmd } => {
                match runtime.exec(container_id, cmd, io, cancel).await {
                    Ok(0) => Outcome::Success,
                    Ok(code) => Outcome::ExitCode {
                        cmd: cmd.clone(),
                        code,
                    },
                    Err(e) => Outcome::Internal(e.to_string()),
                }
            }
            Command::Attach { container_id } => {
                match runtime.attach(container_id, io, cancel).await {
                    Ok(()) => Outcome::Success,
                    Err(e) => Outcome::Internal(e.to_string()),
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl AsyncOutput for StreamOutput {
    async fn write(&self, data: Bytes) -> std::io::Result<()> {
        StreamOutput::write(self, data)
            .await
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::BrokenPipe, e))
    }
}

/// The streams of one exec or attach.
#[derive(Default)]
struct Streams {
    error: Option<SpdyStream>,
    stdin: Option<SpdyStream>,
    stdout: Option<SpdyStream>,
    stderr: Option<SpdyStream>,
    resize: Option<SpdyStream>,
}

impl Streams {
    fn complete(&self, expected: &StdioOptions, protocol: ChannelProtocol) -> bool {
        self.error.is_some()
            && (!expected.stdin || self.stdin.is_some())
            && (!expected.stdout || self.stdout.is_some())
            && (!expected.stderr || expected.tty || self.stderr.is_some())
            && (!(expected.tty && protocol.resizes()) || self.resize.is_some())
    }

    fn add(&mut self, stream: SpdyStream) -> Result<(), String> {
        let stream_type = header(&stream.headers, "streamType")
            .unwrap_or_default()
            .to_string();
        let slot = match stream_type.as_str() {
            "error" => &mut self.error,
            "stdin" => &mut self.stdin,
            "stdout" => &mut self.stdout,
            "stderr" => &mut self.stderr,
            "resize" => &mut self.resize,
            other => return Err(format!("unexpected stream type {other:?}")),
        };
        if slot.is_some() {
            return Err(format!("duplicate {stream_type} stream"));
        }
        *slot = Some(stream);
        Ok(())
    }
}

/// Waits for the client's streams, runs the command, reports, closes.
pub async fn serve(
    mut conn: SpdyConnection,
    protocol: ChannelProtocol,
    options: StdioOptions,
    command: Command,
    runtime: Arc<dyn StreamRuntime>,
    shutdown: CancellationToken,
) {
    let streams = match collect_streams(&mut conn, protocol, &options).await {
        Ok(streams) => streams,
        Err(e) => {
            tracing::warn!(error = %e, "stream setup failed");
            conn.close().await;
            return;
        }
    };
    let Streams {
        error,
        stdin,
        stdout,
        stderr,
        resize,
    } = streams;
    // Only stdin and resize carry anything from the client: the input of the others is
    // dropped here, so whatever the client sends on them is refused, not queued.
    let [error, stdout, stderr] = [error, stdout, stderr].map(|s| s.map(|s| s.output));
    let stderr = stderr.filter(|_| !options.tty);
    let outputs: Vec<StreamOutput> = [&error, &stdout, &stderr]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let (resize, resize_task) = match resize.filter(|_| options.tty) {
        Some(stream) => {
            let (tx, rx) = mpsc::channel(8);
            (
                Some(rx),
                Some(tokio::spawn(decode_resizes(stream.input, tx))),
            )
        }
        None => (None, None),
    };
    let output = |s: Option<StreamOutput>| s.map(|output| Arc::new(output) as Arc<dyn AsyncOutput>);
    let io = ProcessIo {
        stdin: stdin.map(|s| s.input),
        stdout: output(stdout),
        stderr: output(stderr),
        tty: options.tty,
        resize,
    };

    let cancel = shutdown.child_token();
    let outcome = {
        let run = command.run(runtime.as_ref(), io, cancel.clone());
        tokio::pin!(run);
        let closed = conn.closed_token();
        tokio::select! {
            outcome = &mut run => outcome,
            _ = closed.cancelled() => {
                cancel.cancel();
                run.await
            }
        }
    };
    if let Some(task) = resize_task {
        task.abort();
    }
    if let Outcome::Internal(message) = &outcome {
        tracing::warn!(?command, error = %message, "stream command failed");
    }
    if let Some(error) = &error
        && let Some(bytes) = protocol.status_bytes(&outcome)
    {
        let _ = error.write(Bytes::from(bytes)).await;
    }
    for output in &outputs {
        output.close().await;
    }
    conn.close().await;
}

async fn collect_streams(
    conn: &mut SpdyConnection,
    protocol: ChannelProtocol,
    options: &StdioOptions,
) -> Result<Streams, String> {
    let mut streams = Streams::default();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while !streams.complete(options, protocol) {
        let stream = tokio::time::timeout_at(deadline, conn.accept())
            .await
            .map_err(|_| "timed out waiting for the client to open its streams".to_string())?
            .ok_or_else(|| "the client went away before opening its streams".to_string())?;
        streams.add(stream)?;
    }
    Ok(streams)
}

/// The most of one unfinished resize object crius holds: `{"Width":65535,"Height":65535}`
/// is 32 bytes; a client that sends more without finishing one is cut off.
const MAX_PENDING_RESIZE: usize = 4096;

/// Turns the resize stream's JSON objects into terminal sizes.
async fn decode_resizes(mut input: Input, sizes: mpsc::Sender<TerminalSize>) {
    let mut pending = Vec::new();
    while let Some(chunk) = input.recv().await {
        if pending.len() + chunk.len() > MAX_PENDING_RESIZE {
            tracing::debug!("the resize stream sent more than a resize without finishing one");
            return;
        }
        pending.extend_from_slice(&chunk);
        let mut parsed = 0;
        let mut objects =
            serde_json::Deserializer::from_slice(&pending).into_iter::<TerminalSize>();
        loop {
            match objects.next() {
                Some(Ok(size)) => {
                    parsed = objects.byte_offset();
                    if sizes.send(size).await.is_err() {
                        return;
                    }
                }
                // Half an object: wait for the rest.
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "bad terminal size on the resize stream");
                    return;
                }
                None => {
                    parsed = pending.len();
                    break;
                }
            }
        }
        pending.drain(..parsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::streaming::input::ConnectionBudget;

    #[tokio::test]
    async fn resize_objects_split_across_frames_are_decoded() {
        let (tx, rx) = ConnectionBudget::default().stream(4096);
        let (sizes_tx, mut sizes) = mpsc::channel(4);
        let task = tokio::spawn(decode_resizes(rx, sizes_tx));
        tx.send(Bytes::from_static(b"{\"Width\":80,\"Hei"))
            .await
            .unwrap();
        tx.send(Bytes::from_static(
            b"ght\":24}\n{\"Width\":100,\"Height\":30}\n",
        ))
        .await
        .unwrap();
        assert_eq!(
            sizes.recv().await,
            Some(TerminalSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            sizes.recv().await,
            Some(TerminalSize {
                width: 100,
                height: 30
            })
        );
        drop(tx);
        task.await.unwrap();
        assert_eq!(sizes.recv().await, None);
    }

    #[test]
    fn protocol_versions_order_and_status_formats() {
        assert!(
            ChannelProtocol::from_name("v4.channel.k8s.io")
                .unwrap()
                .resizes()
        );
        assert!(!ChannelProtocol::V2.resizes());
        assert_eq!(ChannelProtocol::V2.status_bytes(&Outcome::Success), None);
        assert!(
            ChannelProtocol::V4
                .status_bytes(&Outcome::Success)
                .is_some()
        );
        assert_eq!(ChannelProtocol::from_name("v9.channel.k8s.io"), None);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn the_resize_stream_takes_any_bytes(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 0..12)) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let (tx, rx) = crate::streaming::input::ConnectionBudget::default().stream(64 * 1024);
                let (size_tx, mut size_rx) = mpsc::channel(64);
                let decoder = tokio::spawn(decode_resizes(rx, size_tx));
                for chunk in chunks {
                    if tx.send(Bytes::from(chunk)).await.is_err() {
                        break;
                    }
                    while size_rx.try_recv().is_ok() {}
                }
                drop(tx);
                while size_rx.recv().await.is_some() {}
                decoder.await.unwrap();
            });
        }
    }

    #[tokio::test]
    async fn a_resize_that_never_ends_is_cut_off() {
        let (tx, rx) = crate::streaming::input::ConnectionBudget::default().stream(64 * 1024);
        let (size_tx, _size_rx) = mpsc::channel(4);
        let decoder = tokio::spawn(decode_resizes(rx, size_tx));
        tx.send(Bytes::from_static(b"{\"Width\": ")).await.unwrap();
        let mut sent = 0;
        while tx.send(Bytes::from(vec![b' '; 1024])).await.is_ok() && sent < 100 {
            sent += 1;
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), decoder)
            .await
            .expect("the decoder gives up")
            .unwrap();
        assert!(sent < 100, "it kept reading");
    }
}
