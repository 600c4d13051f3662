//! exec and attach over WebSocket (`v5.channel.k8s.io` down to `channel.k8s.io`, and the
//! `base64` variants). Every message starts with its channel: 0 stdin, 1 stdout, 2 stderr,
//! 3 error (how it ended), 4 resize; in v5, `255, c` closes channel `c` (the client's stdin).
//! The base64 protocols send text: the channel as an ASCII digit, then base64.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::remotecommand::{ChannelProtocol, Command, StdioOptions};
use super::status::Outcome;
use super::{AsyncOutput, ProcessIo, StreamRuntime, TerminalSize};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: the client closed the channel named by the next byte.
const CLOSE: u8 = 255;

const OUTGOING_QUEUE: usize = 64;
/// How long the last messages and the close may take to go out.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// A negotiated WebSocket sub-protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsProtocol {
    pub version: ChannelProtocol,
    pub base64: bool,
}

impl WsProtocol {
    /// The sub-protocols crius accepts, in the order it prefers them.
    pub const NAMES: [&'static str; 9] = [
        "v5.channel.k8s.io",
        "v4.channel.k8s.io",
        "v3.channel.k8s.io",
        "v2.channel.k8s.io",
        "channel.k8s.io",
        "v4.base64.channel.k8s.io",
        "v3.base64.channel.k8s.io",
        "v2.base64.channel.k8s.io",
        "base64.channel.k8s.io",
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        if !Self::NAMES.contains(&name) {
            return None;
        }
        let base64 = name.contains("base64.");
        let version = ChannelProtocol::from_name(&name.replace("base64.", ""))?;
        Some(Self { version, base64 })
    }

    /// No sub-protocol at all means raw `channel.k8s.io`.
    pub fn fallback() -> Self {
        Self {
            version: ChannelProtocol::V1,
            base64: false,
        }
    }

    fn encode(&self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            let mut text = String::with_capacity(1 + data.len().div_ceil(3) * 4);
            text.push(char::from(b'0' + channel));
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
            Message::Text(text.into())
        } else {
            let mut bytes = Vec::with_capacity(1 + data.len());
            bytes.push(channel);
            bytes.extend_from_slice(data);
            Message::Binary(bytes.into())
        }
    }

    /// The channel and payload of a client message; `None` for what carries no data.
    fn decode(&self, message: Message) -> Option<Result<(u8, Bytes), String>> {
        match message {
            Message::Binary(bytes) if !self.base64 => {
                let (&channel, data) = bytes.split_first()?;
                Some(Ok((channel, Bytes::copy_from_slice(data))))
            }
            Message::Text(text) if self.base64 => {
                let (&digit, encoded) = text.as_bytes().split_first()?;
                let channel = digit.wrapping_sub(b'0');
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .map(|data| (channel, Bytes::from(data)))
                        .map_err(|e| format!("bad base64 on channel {channel}: {e}")),
                )
            }
            Message::Binary(_) | Message::Text(_) => {
                Some(Err("message type does not match the sub-protocol".into()))
            }
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => None,
        }
    }
}

/// When something last moved on the socket, for the idle timeout.
struct Activity {
    started: Instant,
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline =
                self.started + Duration::from_millis(self.last.load(Ordering::Relaxed)) + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One output channel.
struct ChannelOutput {
    channel: u8,
    protocol: WsProtocol,
    outgoing: mpsc::Sender<Message>,
}

#[async_trait::async_trait]
impl AsyncOutput for ChannelOutput {
    async fn write(&self, data: Bytes) -> std::io::Result<()> {
        self.outgoing
            .send(self.protocol.encode(self.channel, &data))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "websocket closed"))
    }
}

pub struct Session {
    pub protocol: WsProtocol,
    pub options: StdioOptions,
    pub command: Command,
    pub runtime: Arc<dyn StreamRuntime>,
    pub shutdown: CancellationToken,
    pub idle_timeout: Duration,
}

impl Session {
    pub async fn serve(self, socket: WebSocket) {
        let Session {
            protocol,
            options,
            command,
            runtime,
            shutdown,
            idle_timeout,
        } = self;
        let activity = Arc::new(Activity {
            started: Instant::now(),
            last: AtomicU64::new(0),
        });
        let (sink, mut incoming) = socket.split();
        let (outgoing, outgoing_rx) = mpsc::channel(OUTGOING_QUEUE);
        let writer = tokio::spawn(write_messages(sink, outgoing_rx, activity.clone()));

        let output = |channel| -> Arc<dyn AsyncOutput> {
            Arc::new(ChannelOutput {
                channel,
                protocol,
                outgoing: outgoing.clone(),
            })
        };
        let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(32);
        let (resize_tx, resize_rx) = mpsc::channel::<TerminalSize>(8);
        let mut stdin_tx = options.stdin.then_some(stdin_tx);
        let resize_tx = options.tty.then_some(resize_tx);
        let io = ProcessIo {
            stdin: options.stdin.then_some(stdin_rx),
            stdout: options.stdout.then(|| output(STDOUT)),
            stderr: (options.stderr && !options.tty).then(|| output(STDERR)),
            tty: options.tty,
            resize: options.tty.then_some(resize_rx),
        };
        // The first message tells the client the session is open.
        let first = if options.stdout {
            STDOUT
        } else if options.stderr && !options.tty {
            STDERR
        } else {
            ERROR
        };
        let _ = outgoing.send(protocol.encode(first, &[])).await;

        let cancel = shutdown.child_token();
        let run = command.run(runtime.as_ref(), io, cancel.clone());
        tokio::pin!(run);
        let mut client_gone = false;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                message = incoming.next(), if !client_gone => match message {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        client_gone = true;
                        stdin_tx = None;
                        cancel.cancel();
                    }
                    Some(Ok(message)) => {
                        activity.touch();
                        let Some(decoded) = protocol.decode(message) else { continue };
                        match decoded {
                            Ok((channel, data)) => {
                                route(channel, data, protocol, &mut stdin_tx, resize_tx.as_ref()).await;
                            }
                            Err(e) => tracing::debug!(error = %e, "bad websocket message"),
                        }
                    }
                },
                _ = activity.idle_for(idle_timeout), if !client_gone => {
                    tracing::info!(timeout = ?idle_timeout, "closing an idle stream connection");
                    client_gone = true;
                    stdin_tx = None;
                    cancel.cancel();
                }
            }
        };
        drop(stdin_tx);
        if let Outcome::Internal(message) = &outcome {
            tracing::warn!(?command, error = %message, "stream command failed");
        }
        if let Some(bytes) = protocol.version.status_bytes(&outcome) {
            let _ = outgoing.send(protocol.encode(ERROR, &bytes)).await;
        }
        let _ = outgoing.send(Message::Close(None)).await;
        drop(outgoing);
        let abort = writer.abort_handle();
        if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
            abort.abort();
        }
    }
}

/// Delivers a client message to its channel.
async fn route(
    channel: u8,
    data: Bytes,
    protocol: WsProtocol,
    stdin: &mut Option<mpsc::Sender<Bytes>>,
    resize: Option<&mpsc::Sender<TerminalSize>>,
) {
    match channel {
        STDIN => {
            if let Some(tx) = stdin
                && !data.is_empty()
                && tx.send(data).await.is_err()
            {
                *stdin = None;
            }
        }
        RESIZE => {
            let Some(resize) = resize else { return };
            let sizes = serde_json::Deserializer::from_slice(&data).into_iter::<TerminalSize>();
            for size in sizes {
                match size {
                    Ok(size) => {
                        let _ = resize.send(size).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "bad terminal size");
                        break;
                    }
                }
            }
        }
        CLOSE if protocol.version >= ChannelProtocol::V5 => {
            if data.first() == Some(&STDIN) {
                *stdin = None;
            }
        }
        other => tracing::debug!(channel = other, "websocket message for an unknown channel"),
    }
}

async fn write_messages(
    mut sink: futures::stream::SplitSink<WebSocket, Message>,
    mut outgoing: mpsc::Receiver<Message>,
    activity: Arc<Activity>,
) {
    while let Some(message) = outgoing.recv().await {
        let closing = matches!(message, Message::Close(_));
        if sink.send(message).await.is_err() {
            return;
        }
        activity.touch();
        if closing {
            break;
        }
    }
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_protocols_map_to_versions_and_encodings() {
        let v5 = WsProtocol::from_name("v5.channel.k8s.io").unwrap();
        assert_eq!(v5.version, ChannelProtocol::V5);
        assert!(!v5.base64);
        let b64 = WsProtocol::from_name("v4.base64.channel.k8s.io").unwrap();
        assert_eq!(b64.version, ChannelProtocol::V4);
        assert!(b64.base64);
        assert_eq!(
            WsProtocol::from_name("base64.channel.k8s.io")
                .unwrap()
                .version,
            ChannelProtocol::V1
        );
        assert_eq!(WsProtocol::from_name("v5.base64.channel.k8s.io"), None);
        assert_eq!(WsProtocol::from_name("chat"), None);
    }

    #[test]
    fn messages_carry_their_channel() {
        let raw = WsProtocol::fallback();
        assert_eq!(
            raw.encode(STDOUT, b"hi"),
            Message::Binary(Bytes::from_static(&[1, b'h', b'i']))
        );
        assert_eq!(
            raw.decode(Message::Binary(Bytes::from_static(&[0, b'x'])))
                .unwrap()
                .unwrap(),
            (STDIN, Bytes::from_static(b"x"))
        );
        let b64 = WsProtocol::from_name("base64.channel.k8s.io").unwrap();
        assert_eq!(b64.encode(STDERR, b"hi"), Message::Text("2aGk=".into()));
        assert_eq!(
            b64.decode(Message::Text("0Zm9vCg==".into()))
                .unwrap()
                .unwrap(),
            (STDIN, Bytes::from_static(b"foo\n"))
        );
        assert!(b64.decode(Message::Text("0!!".into())).unwrap().is_err());
        assert!(raw.decode(Message::Text("0".into())).unwrap().is_err());
        assert!(raw.decode(Message::Binary(Bytes::new())).is_none());
    }
}
