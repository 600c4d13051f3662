//! exec and attach over WebSocket (`v5.channel.k8s.io` down to `channel.k8s.io`, and the
//! `base64` variants). Every message starts with its channel: 0 stdin, 1 stdout, 2 stderr,
//! 3 error (how it ended), 4 resize; in v5, `255, c` closes channel `c` (the client's stdin).
//! The base64 protocols send text: the channel as an ASCII digit, then base64.
//!
//! A client message is at most [`MAX_MESSAGE`] bytes; stdin waits in a queue bounded in
//! bytes ([`crate::streaming::input`]), so a client that sends faster than the process reads
//! is pushed back on, never buffered without end.

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

use super::input::{ConnectionBudget, InputSender, STREAM_INPUT_LIMIT};
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
/// While stdin waits for the process, how often the client is pinged to learn whether it
/// is still there.
const PEER_PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// The largest message (and frame) a client may send, held whole until it is routed: as
/// much as a SPDY connection may have waiting for the process
/// ([`crate::streaming::input::CONNECTION_INPUT_LIMIT`]). client-go sends stdin in
/// messages of one read (32 KiB), base64 ones a third larger.
pub const MAX_MESSAGE: usize = super::input::CONNECTION_INPUT_LIMIT;
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
                let &channel = bytes.first()?;
                // A view, not a copy: stdin copies what it queues piece by piece.
                Some(Ok((channel, bytes.slice(1..))))
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
        let gone = CancellationToken::new();
        let writer = tokio::spawn(write_messages(
            sink,
            outgoing_rx,
            activity.clone(),
            gone.clone(),
        ));

        let output = |channel| -> Arc<dyn AsyncOutput> {
            Arc::new(ChannelOutput {
                channel,
                protocol,
                outgoing: outgoing.clone(),
            })
        };
        let (stdin_tx, stdin_rx) = ConnectionBudget::default().stream(STREAM_INPUT_LIMIT);
        let (resize_tx, resize_rx) = mpsc::channel::<TerminalSize>(8);
        let io = ProcessIo {
            stdin: options.stdin.then_some(stdin_rx),
            stdout: options.stdout.then(|| output(STDOUT)),
            stderr: (options.stderr && !options.tty).then(|| output(STDERR)),
            tty: options.tty,
            resize: options.tty.then_some(resize_rx),
        };
        // The first message tells the client the session is open.
        let _ = outgoing
            .send(protocol.encode(opening_channel(&options), &[]))
            .await;

        let cancel = shutdown.child_token();
        let run = command.run(runtime.as_ref(), io, cancel.clone());
        tokio::pin!(run);
        // The client's messages are read beside the command, so a read that waits for room
        // on stdin never keeps the command's end from being seen.
        let client = ClientInput {
            protocol,
            stdin: options.stdin.then_some(stdin_tx),
            resize: options.tty.then_some(resize_tx),
            activity: activity.clone(),
            idle_timeout,
            outgoing: outgoing.clone(),
            gone,
        };
        let outcome = tokio::select! {
            outcome = &mut run => outcome,
            () = client.read(&mut incoming) => {
                // The client hung up or went idle: stop the command.
                cancel.cancel();
                run.await
            }
        };
        if let Outcome::Internal(message) = &outcome {
            tracing::warn!(?command, error = %message, "stream command failed");
        }
        close(protocol, outgoing, &outcome, writer).await;
    }
}

/// The channel of the message that tells the client the session is open.
fn opening_channel(options: &StdioOptions) -> u8 {
    if options.stdout {
        STDOUT
    } else if options.stderr && !options.tty {
        STDERR
    } else {
        ERROR
    }
}

/// Sends the command's status and the close, then lets the writer finish. Both wait for
/// room at most a grace period: a client that stopped reading gets neither.
async fn close(
    protocol: WsProtocol,
    outgoing: mpsc::Sender<Message>,
    outcome: &Outcome,
    writer: tokio::task::JoinHandle<()>,
) {
    let farewell = async {
        if let Some(bytes) = protocol.version.status_bytes(outcome) {
            let _ = outgoing.send(protocol.encode(ERROR, &bytes)).await;
        }
        let _ = outgoing.send(Message::Close(None)).await;
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, farewell).await;
    drop(outgoing);
    let abort = writer.abort_handle();
    if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
        abort.abort();
    }
}

/// Where the client's messages go while the command runs.
struct ClientInput {
    protocol: WsProtocol,
    stdin: Option<InputSender>,
    resize: Option<mpsc::Sender<TerminalSize>>,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    /// For pings that learn whether a client that is not read from is still there.
    outgoing: mpsc::Sender<Message>,
    /// Cancelled when a write to the client failed: it has gone.
    gone: CancellationToken,
}

impl ClientInput {
    /// Routes the client's messages until it hangs up, stays idle too long, or a write to
    /// it fails.
    async fn read(mut self, incoming: &mut futures::stream::SplitStream<WebSocket>) {
        let gone = self.gone.clone();
        tokio::select! {
            () = self.route_messages(incoming) => {}
            _ = gone.cancelled() => {}
        }
    }

    async fn route_messages(&mut self, incoming: &mut futures::stream::SplitStream<WebSocket>) {
        loop {
            let message = tokio::select! {
                message = incoming.next() => message,
                _ = self.activity.idle_for(self.idle_timeout) => {
                    tracing::info!(timeout = ?self.idle_timeout, "closing an idle stream connection");
                    return;
                }
            };
            let message = match message {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(message)) => message,
            };
            self.activity.touch();
            match self.protocol.decode(message) {
                None => {}
                Some(Ok((STDIN, data))) => self.deliver_stdin(data).await,
                Some(Ok((channel, data))) => {
                    route(
                        channel,
                        data,
                        self.protocol,
                        &mut self.stdin,
                        self.resize.as_ref(),
                    )
                    .await;
                }
                Some(Err(e)) => tracing::debug!(error = %e, "bad websocket message"),
            }
        }
    }

    /// Queues stdin; while that waits for the process, pings the client now and then, so a
    /// client that went away is noticed by the failing write.
    async fn deliver_stdin(&mut self, data: Bytes) {
        let Some(tx) = &self.stdin else { return };
        if data.is_empty() {
            return;
        }
        let probe = async {
            loop {
                tokio::time::sleep(PEER_PROBE_INTERVAL).await;
                let _ = self.outgoing.try_send(Message::Ping(Bytes::new()));
            }
        };
        let sent = tokio::select! {
            sent = tx.send(data) => sent,
            () = probe => Ok(()),
        };
        if sent.is_err() {
            self.stdin = None;
        }
    }
}

/// Delivers a client message to its channel.
async fn route(
    channel: u8,
    data: Bytes,
    protocol: WsProtocol,
    stdin: &mut Option<InputSender>,
    resize: Option<&mpsc::Sender<TerminalSize>>,
) {
    // stdin has a path of its own: ClientInput::deliver_stdin.
    match channel {
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
    gone: CancellationToken,
) {
    while let Some(message) = outgoing.recv().await {
        let closing = matches!(message, Message::Close(_));
        // Pings are not activity: the probes must not keep an idle session.
        let ping = matches!(message, Message::Ping(_));
        if sink.send(message).await.is_err() {
            gone.cancel();
            return;
        }
        if !ping {
            activity.touch();
        }
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

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn any_protocol() -> impl Strategy<Value = WsProtocol> {
        prop::sample::select(WsProtocol::NAMES.to_vec())
            .prop_map(|name| WsProtocol::from_name(name).unwrap_or_else(WsProtocol::fallback))
    }

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_client_message_decodes_or_is_refused(
            protocol in any_protocol(),
            bytes in proptest::collection::vec(any::<u8>(), 0..2048),
            text in ".{0,512}",
        ) {
            for message in [Message::Binary(bytes.clone().into()), Message::Text(text.clone().into())] {
                if let Some(Ok((channel, data))) = protocol.decode(message) {
                    prop_assert!(data.len() <= bytes.len().max(text.len()));
                    if !protocol.base64 {
                        prop_assert_eq!(channel, bytes[0]);
                        prop_assert_eq!(&data[..], &bytes[1..]);
                    }
                }
            }
        }

        #[test]
        fn what_crius_encodes_decodes_to_the_same(
            protocol in any_protocol(),
            channel in 0u8..5,
            data in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let decoded = protocol.decode(protocol.encode(channel, &data));
            let (got_channel, got) = decoded.unwrap().unwrap();
            prop_assert_eq!(got_channel, channel);
            prop_assert_eq!(&got[..], &data[..]);
        }

        #[test]
        fn any_routed_message_leaves_the_session_sound(
            protocol in any_protocol(),
            messages in proptest::collection::vec((any::<u8>(), proptest::collection::vec(any::<u8>(), 0..256)), 0..32),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            runtime.block_on(async {
                let (stdin_tx, mut stdin_rx) = ConnectionBudget::default().stream(STREAM_INPUT_LIMIT);
                let (resize_tx, mut resize_rx) = mpsc::channel(64);
                let mut stdin = Some(stdin_tx);
                for (channel, data) in messages {
                    route(channel, Bytes::from(data), protocol, &mut stdin, Some(&resize_tx)).await;
                    while resize_rx.try_recv().is_ok() {}
                }
                drop(stdin);
                // Nothing but stdin's own messages reach stdin: route never writes there.
                assert!(stdin_rx.recv().await.is_none());
            });
        }
    }
}
