//! A server-side SPDY/3.1 connection: the client opens streams, crius answers them.
//!
//! One reader task decodes frames and routes them: `SYN_STREAM` becomes a new
//! [`SpdyStream`] (answered with `SYN_REPLY`, or refused past the connection's stream
//! limit), `DATA` goes to the stream's input (bounded in bytes per stream and per
//! connection, see [`crate::streaming::input`]), `FIN` and `RST_STREAM` end that input,
//! `PING` is echoed. One writer task encodes the frames every
//! stream output queues, in order. Flow control is not done: the Go peers do none either.
//! Both tasks end when the peer goes away, on an I/O or protocol error, after the idle
//! timeout, or on [`SpdyConnection::close`]; every stream's input ends with them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::streaming::input::{ConnectionBudget, Input, InputSender, STREAM_INPUT_LIMIT};
use crate::streaming::peer::{self, PeerSocket};

use super::frame::{
    FLAG_FIN, Frame, Headers, RST_CANCEL, RST_PROTOCOL_ERROR, RST_REFUSED_STREAM, SpdyCodec,
};

/// Frames queued for the writer before senders wait.
const OUTGOING_QUEUE: usize = 64;
/// Streams the handler has not taken yet.
const NEW_STREAM_QUEUE: usize = 64;
/// Output is cut into frames of at most this size.
const MAX_DATA_FRAME: usize = 64 * 1024;
/// After our GOAWAY, how long the peer has to hang up before the connection is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The write side of a stream has gone: the connection closed or the peer reset it.
#[derive(Debug, thiserror::Error)]
#[error("the stream is closed")]
pub struct StreamClosed;

/// A stream the client opened.
pub struct SpdyStream {
    pub id: u32,
    pub headers: Headers,
    /// Data from the client; ends at its FIN or reset, or when the connection closes.
    /// Dropping it refuses whatever the client sends on the stream from then on.
    pub input: Input,
    pub output: StreamOutput,
    /// Counts the stream against the connection's limit while the handler holds it.
    _slot: StreamSlot,
}

/// One of a connection's stream places, given back when the stream is dropped.
struct StreamSlot(Arc<Shared>);

impl StreamSlot {
    fn take(shared: &Arc<Shared>) -> Self {
        shared.live.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes to one stream. Cheap to clone.
#[derive(Clone)]
pub struct StreamOutput {
    id: u32,
    shared: Arc<Shared>,
    reset: CancellationToken,
}

impl StreamOutput {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends data to the client.
    pub async fn write(&self, data: Bytes) -> Result<(), StreamClosed> {
        let mut rest = data;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(MAX_DATA_FRAME));
            self.send(Frame::Data {
                stream_id: self.id,
                flags: 0,
                data: chunk,
            })
            .await?;
        }
        Ok(())
    }

    /// Half-closes the stream: no more data from crius.
    pub async fn close(&self) {
        let _ = self
            .send(Frame::Data {
                stream_id: self.id,
                flags: FLAG_FIN,
                data: Bytes::new(),
            })
            .await;
    }

    /// Resets the stream in both directions and forgets it.
    pub async fn reset(&self) {
        if self.reset.is_cancelled() {
            return;
        }
        self.reset.cancel();
        self.shared.forget(self.id);
        self.shared
            .send_control(Frame::RstStream {
                stream_id: self.id,
                status: RST_CANCEL,
            })
            .await;
    }

    /// Resolves when the peer reset the stream or the connection closed.
    pub async fn closed(&self) {
        tokio::select! {
            _ = self.reset.cancelled() => {}
            _ = self.shared.closed.cancelled() => {}
        }
    }

    async fn send(&self, frame: Frame) -> Result<(), StreamClosed> {
        if self.reset.is_cancelled() || self.shared.closed.is_cancelled() {
            return Err(StreamClosed);
        }
        tokio::select! {
            sent = self.shared.outgoing.send(frame) => sent.map_err(|_| StreamClosed),
            _ = self.reset.cancelled() => Err(StreamClosed),
            _ = self.shared.closed.cancelled() => Err(StreamClosed),
        }
    }
}

/// What the reader knows of an open stream.
struct StreamEntry {
    input: InputSender,
    reset: CancellationToken,
}

struct Shared {
    outgoing: mpsc::Sender<Frame>,
    streams: Mutex<HashMap<u32, StreamEntry>>,
    /// Streams open at once; more are refused.
    max_streams: usize,
    /// Streams handed out (or waiting to be) that the handler has not dropped: with their
    /// headers, what a client's streams cost.
    live: std::sync::atomic::AtomicUsize,
    /// What the streams' unread input may hold together.
    budget: ConnectionBudget,
    /// The client's socket, to see it hang up while the reader waits for room.
    peer: Option<PeerSocket>,
    /// Cancelled when the connection is gone.
    closed: CancellationToken,
    /// Milliseconds since `started` of the last frame in either direction.
    last_activity: AtomicU64,
    started: Instant,
}

/// Whether a new stream of the client's may open.
enum Admission {
    Admitted,
    /// Its id is open already: a protocol error.
    Duplicate,
    /// The connection has as many streams as it may.
    Full,
}

impl Shared {
    /// Routes a new stream's input to it, unless the id is taken or the connection is full.
    fn admit(
        &self,
        stream_id: u32,
        flags: u8,
        input: InputSender,
        reset: CancellationToken,
    ) -> Admission {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.contains_key(&stream_id) {
            return Admission::Duplicate;
        }
        // Streams the handler holds count, and so do the routes to streams it let go of
        // whose client has not ended them yet (at twice the limit).
        if self.live.load(Ordering::SeqCst) >= self.max_streams
            || streams.len() >= 2 * self.max_streams
        {
            return Admission::Full;
        }
        // A SYN_STREAM with FIN opens a stream the client will never write to.
        if flags & FLAG_FIN == 0 {
            streams.insert(stream_id, StreamEntry { input, reset });
        }
        Admission::Admitted
    }

    /// Queues a frame of the connection's own (a reply, a reset): gives up when the
    /// connection closes, so a client that stops reading cannot park the sender here.
    async fn send_control(&self, frame: Frame) {
        tokio::select! {
            _ = self.outgoing.send(frame) => {}
            _ = self.closed.cancelled() => {}
        }
    }

    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_activity.store(now, Ordering::Relaxed);
    }

    fn idle_deadline(&self, timeout: Duration) -> Instant {
        self.started + Duration::from_millis(self.last_activity.load(Ordering::Relaxed)) + timeout
    }

    fn forget(&self, id: u32) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// The connection: hand it an upgraded byte stream, take the client's streams from
/// [`SpdyConnection::accept`].
pub struct SpdyConnection {
    shared: Arc<Shared>,
    new_streams: mpsc::Receiver<SpdyStream>,
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    closing: CancellationToken,
}

impl SpdyConnection {
    /// Starts serving `io`. A connection with no frames either way for `idle_timeout` closes;
    /// streams past `max_streams` open at once are refused. `peer` is the client's socket
    /// under `io`, when crius has it.
    pub fn new<T>(
        io: T,
        idle_timeout: Duration,
        max_streams: usize,
        peer: Option<PeerSocket>,
    ) -> Self
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let (outgoing, outgoing_rx) = mpsc::channel(OUTGOING_QUEUE);
        let (new_streams_tx, new_streams) = mpsc::channel(NEW_STREAM_QUEUE);
        let shared = Arc::new(Shared {
            outgoing,
            streams: Mutex::new(HashMap::new()),
            max_streams,
            live: std::sync::atomic::AtomicUsize::new(0),
            budget: ConnectionBudget::default(),
            peer,
            closed: CancellationToken::new(),
            last_activity: AtomicU64::new(0),
            started: Instant::now(),
        });
        let closing = CancellationToken::new();
        let writer = tokio::spawn(write_frames(
            FramedWrite::new(write_half, SpdyCodec::new()),
            outgoing_rx,
            shared.clone(),
            closing.clone(),
        ));
        let reader = tokio::spawn(read_frames(
            FramedRead::new(read_half, SpdyCodec::new()),
            shared.clone(),
            new_streams_tx,
            idle_timeout,
        ));
        Self {
            shared,
            new_streams,
            reader: Some(reader),
            writer: Some(writer),
            closing,
        }
    }

    /// The next stream the client opens; `None` once the connection is closed.
    pub async fn accept(&mut self) -> Option<SpdyStream> {
        tokio::select! {
            stream = self.new_streams.recv() => stream,
            _ = self.shared.closed.cancelled() => None,
        }
    }

    /// Cancelled when the connection is gone.
    pub fn closed_token(&self) -> CancellationToken {
        self.shared.closed.clone()
    }

    /// Streams the reader still tracks.
    pub fn open_streams(&self) -> usize {
        self.shared
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Says GOAWAY after everything queued so far, lets the client hang up for a moment,
    /// then drops the connection.
    pub async fn close(mut self) {
        let _ = self.shared.outgoing.try_send(Frame::GoAway {
            last_good_stream_id: 0,
            status: 0,
        });
        self.closing.cancel();
        if let Some(writer) = self.writer.take() {
            let abort = writer.abort_handle();
            if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
                abort.abort();
            }
        }
        if let Some(reader) = self.reader.take() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(CLOSE_GRACE, reader).await.is_err() {
                abort.abort();
            }
        }
        self.shared.closed.cancel();
    }
}

impl Drop for SpdyConnection {
    fn drop(&mut self) {
        self.shared.closed.cancel();
        for task in [self.reader.take(), self.writer.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

async fn write_frames<W>(
    mut sink: FramedWrite<W, SpdyCodec>,
    mut outgoing: mpsc::Receiver<Frame>,
    shared: Arc<Shared>,
    closing: CancellationToken,
) where
    W: AsyncWrite + Send + Unpin,
{
    loop {
        let frame = tokio::select! {
            frame = outgoing.recv() => frame,
            _ = closing.cancelled() => break,
            _ = shared.closed.cancelled() => return,
        };
        let Some(frame) = frame else { break };
        // A client that stops reading leaves this write waiting: the idle watch closes the
        // connection then.
        let sent = tokio::select! {
            sent = sink.send(frame) => sent,
            _ = shared.closed.cancelled() => return,
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "SPDY write failed");
            shared.closed.cancel();
            return;
        }
        shared.touch();
    }
    // Closing: what was queued before the close still goes out, GOAWAY last.
    while let Ok(frame) = outgoing.try_recv() {
        if sink.feed(frame).await.is_err() {
            break;
        }
    }
    let _ = sink.flush().await;
    let _ = sink.get_mut().shutdown().await;
}

async fn read_frames<R>(
    mut frames: FramedRead<R, SpdyCodec>,
    shared: Arc<Shared>,
    new_streams: mpsc::Sender<SpdyStream>,
    idle_timeout: Duration,
) where
    R: AsyncRead + Send + Unpin,
{
    let mut new_streams = Some(new_streams);
    loop {
        let next = tokio::select! {
            next = frames.next() => next,
            _ = shared.closed.cancelled() => break,
            _ = idle_watch(&shared, idle_timeout) => {
                tracing::info!(timeout = ?idle_timeout, "closing an idle stream connection");
                break;
            }
        };
        match next {
            None => break,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "SPDY read failed");
                break;
            }
            Some(Ok(frame)) => {
                shared.touch();
                // Handling may wait for room (the process's stdin, the queue to a client
                // that does not read): the idle timeout still ends the connection.
                let handled = tokio::select! {
                    handled = handle_frame(frame, &shared, &mut new_streams) => handled,
                    _ = idle_watch(&shared, idle_timeout) => {
                        tracing::info!(timeout = ?idle_timeout, "closing an idle stream connection");
                        false
                    }
                };
                if !handled {
                    break;
                }
            }
        }
    }
    shared.closed.cancel();
    shared
        .streams
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
}

/// Resolves once nothing has moved for `timeout`.
async fn idle_watch(shared: &Shared, timeout: Duration) {
    loop {
        let deadline = shared.idle_deadline(timeout);
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Handles one frame from the client; `false` ends the connection.
async fn handle_frame(
    frame: Frame,
    shared: &Arc<Shared>,
    new_streams: &mut Option<mpsc::Sender<SpdyStream>>,
) -> bool {
    match frame {
        Frame::SynStream {
            stream_id,
            flags,
            headers,
            ..
        } => open_stream(stream_id, flags, headers, shared, new_streams).await,
        Frame::Data {
            stream_id,
            flags,
            data,
        } => {
            deliver_data(stream_id, flags, data, shared).await;
            true
        }
        Frame::RstStream { stream_id, .. } => {
            let entry = shared
                .streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&stream_id);
            if let Some(entry) = entry {
                entry.reset.cancel();
            }
            true
        }
        Frame::Ping { id } => {
            // Odd ids are the client's pings; even ones would answer ours, and crius sends none.
            if !id.is_multiple_of(2) {
                shared.send_control(Frame::Ping { id }).await;
            }
            true
        }
        Frame::GoAway { .. } => {
            // No new streams; the open ones may finish.
            *new_streams = None;
            true
        }
        Frame::SynReply { .. }
        | Frame::Headers { .. }
        | Frame::Settings { .. }
        | Frame::WindowUpdate { .. }
        | Frame::Unknown { .. } => true,
    }
}

async fn open_stream(
    stream_id: u32,
    flags: u8,
    headers: Headers,
    shared: &Arc<Shared>,
    new_streams: &mut Option<mpsc::Sender<SpdyStream>>,
) -> bool {
    let rst = |status| Frame::RstStream { stream_id, status };
    // Client streams have odd ids.
    if stream_id.is_multiple_of(2) {
        shared.send_control(rst(RST_PROTOCOL_ERROR)).await;
        return true;
    }
    let Some(sender) = new_streams.as_ref() else {
        shared.send_control(rst(RST_REFUSED_STREAM)).await;
        return true;
    };
    let (input_tx, input) = shared.budget.stream(STREAM_INPUT_LIMIT);
    let reset = CancellationToken::new();
    match shared.admit(stream_id, flags, input_tx, reset.clone()) {
        Admission::Admitted => {}
        Admission::Full => {
            tracing::debug!(stream_id, "too many streams on one connection; refused");
            shared.send_control(rst(RST_REFUSED_STREAM)).await;
            return true;
        }
        Admission::Duplicate => {
            shared.send_control(rst(RST_PROTOCOL_ERROR)).await;
            return false;
        }
    }
    if shared
        .outgoing
        .send(Frame::SynReply {
            stream_id,
            flags: 0,
            headers: Vec::new(),
        })
        .await
        .is_err()
    {
        return false;
    }
    let stream = SpdyStream {
        id: stream_id,
        headers,
        input,
        output: StreamOutput {
            id: stream_id,
            shared: shared.clone(),
            reset,
        },
        _slot: StreamSlot::take(shared),
    };
    let taken = tokio::select! {
        sent = sender.send(stream) => sent.is_ok(),
        _ = shared.closed.cancelled() => return false,
    };
    if !taken {
        // Nobody takes streams any more.
        shared.forget(stream_id);
        shared.send_control(rst(RST_REFUSED_STREAM)).await;
    }
    true
}

async fn deliver_data(stream_id: u32, flags: u8, data: Bytes, shared: &Arc<Shared>) {
    let input = shared
        .streams
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&stream_id)
        .map(|entry| entry.input.clone());
    // Data for a stream that is gone (reset, never opened, or whose input nobody reads) is
    // dropped.
    if let Some(input) = input
        && !data.is_empty()
    {
        let delivered = tokio::select! {
            sent = input.send(data) => sent.is_ok(),
            _ = shared.closed.cancelled() => return,
            () = peer::hang_up(shared.peer.as_ref()) => {
                tracing::debug!(stream_id, "the client hung up while its input waited");
                shared.closed.cancel();
                return;
            }
        };
        if !delivered {
            // The handler dropped the stream's input: it wants no more.
            shared.forget(stream_id);
            return;
        }
    }
    if flags & FLAG_FIN != 0 {
        shared.forget(stream_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client end of an in-memory connection.
    struct Client {
        read: FramedRead<tokio::io::ReadHalf<tokio::io::DuplexStream>, SpdyCodec>,
        write: FramedWrite<tokio::io::WriteHalf<tokio::io::DuplexStream>, SpdyCodec>,
    }

    impl Client {
        async fn send(&mut self, frame: Frame) {
            self.write.send(frame).await.unwrap();
        }

        async fn next(&mut self) -> Option<Frame> {
            tokio::time::timeout(Duration::from_secs(5), self.read.next())
                .await
                .expect("a frame in time")
                .map(|f| f.unwrap())
        }

        async fn open(&mut self, id: u32, stream_type: &str) {
            self.send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: vec![("streamtype".into(), stream_type.into())],
            })
            .await;
        }
    }

    fn pair(idle: Duration) -> (SpdyConnection, Client) {
        let (server, client) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(client);
        (
            SpdyConnection::new(server, idle, 8, None),
            Client {
                read: FramedRead::new(read, SpdyCodec::new()),
                write: FramedWrite::new(write, SpdyCodec::new()),
            },
        )
    }

    #[tokio::test]
    async fn streams_are_answered_and_carry_data_both_ways() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "stdin").await;
        let mut stream = conn.accept().await.unwrap();
        assert_eq!(stream.id, 1);
        assert_eq!(
            super::super::frame::header(&stream.headers, "streamType"),
            Some("stdin")
        );
        assert!(matches!(
            client.next().await,
            Some(Frame::SynReply { stream_id: 1, .. })
        ));
        client
            .send(Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"in"),
            })
            .await;
        assert_eq!(
            stream.input.recv().await.unwrap(),
            Bytes::from_static(b"in")
        );
        assert_eq!(stream.input.recv().await, None, "FIN ends the input");
        assert_eq!(conn.open_streams(), 0);

        stream
            .output
            .write(Bytes::from_static(b"out"))
            .await
            .unwrap();
        stream.output.close().await;
        assert_eq!(
            client.next().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: 0,
                data: Bytes::from_static(b"out")
            })
        );
        assert_eq!(
            client.next().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::new()
            })
        );
    }

    #[tokio::test]
    async fn pings_are_echoed_and_bad_stream_ids_reset() {
        let (_conn, mut client) = pair(Duration::from_secs(60));
        client.send(Frame::Ping { id: 3 }).await;
        assert_eq!(client.next().await, Some(Frame::Ping { id: 3 }));
        client.open(2, "data").await;
        assert_eq!(
            client.next().await,
            Some(Frame::RstStream {
                stream_id: 2,
                status: RST_PROTOCOL_ERROR
            })
        );
    }

    #[tokio::test]
    async fn a_client_reset_ends_input_and_output() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "data").await;
        let mut stream = conn.accept().await.unwrap();
        client.next().await;
        client
            .send(Frame::RstStream {
                stream_id: 1,
                status: RST_CANCEL,
            })
            .await;
        assert_eq!(stream.input.recv().await, None);
        stream.output.closed().await;
        assert!(stream.output.write(Bytes::from_static(b"x")).await.is_err());
        assert_eq!(conn.open_streams(), 0);
    }

    #[tokio::test]
    async fn close_sends_queued_data_then_goaway() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "stdout").await;
        let stream = conn.accept().await.unwrap();
        client.next().await;
        stream
            .output
            .write(Bytes::from_static(b"last"))
            .await
            .unwrap();
        let closing = tokio::spawn(conn.close());
        assert!(matches!(client.next().await, Some(Frame::Data { .. })));
        assert!(matches!(client.next().await, Some(Frame::GoAway { .. })));
        assert_eq!(client.next().await, None, "the server hung up its side");
        drop(client);
        closing.await.unwrap();
    }

    #[tokio::test]
    async fn streams_past_the_limit_are_refused() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        let mut accepted = Vec::new();
        for i in 0..8u32 {
            client.open(2 * i + 1, "data").await;
            accepted.push(conn.accept().await.unwrap());
            assert!(matches!(client.next().await, Some(Frame::SynReply { .. })));
        }
        client.open(17, "data").await;
        assert_eq!(
            client.next().await,
            Some(Frame::RstStream {
                stream_id: 17,
                status: RST_REFUSED_STREAM
            })
        );
        assert_eq!(conn.open_streams(), 8);
    }

    #[tokio::test]
    async fn input_nobody_reads_is_refused_without_stopping_the_connection() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "error").await;
        let stream = conn.accept().await.unwrap();
        client.next().await;
        drop(stream.input);
        // Far more than any stream or connection may hold.
        for _ in 0..64 {
            client
                .send(Frame::Data {
                    stream_id: 1,
                    flags: 0,
                    data: Bytes::from(vec![0u8; 512 * 1024]),
                })
                .await;
        }
        client.send(Frame::Ping { id: 5 }).await;
        assert_eq!(client.next().await, Some(Frame::Ping { id: 5 }));
        assert_eq!(conn.open_streams(), 0, "the unread stream was forgotten");
    }

    #[tokio::test]
    async fn a_stream_that_is_not_read_holds_only_its_limit() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "stdin").await;
        let mut stream = conn.accept().await.unwrap();
        client.next().await;
        let sender = tokio::spawn(async move {
            for _ in 0..16 {
                client
                    .send(Frame::Data {
                        stream_id: 1,
                        flags: 0,
                        data: Bytes::from(vec![7u8; 64 * 1024]),
                    })
                    .await;
            }
            client
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !sender.is_finished(),
            "the reader took more than the stream may hold"
        );
        let mut read = 0;
        while read < 16 * 64 * 1024 {
            read += stream.input.recv().await.unwrap().len();
        }
        let _client = sender.await.unwrap();
    }

    #[tokio::test]
    async fn an_idle_connection_closes() {
        let (mut conn, _client) = pair(Duration::from_millis(200));
        let started = std::time::Instant::now();
        assert!(conn.accept().await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(150));
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_when_idle() {
        let (mut conn, mut client) = pair(Duration::from_millis(300));
        client.open(1, "stdout").await;
        let stream = conn.accept().await.unwrap();
        let output = stream.output.clone();
        let writer = tokio::spawn(async move {
            let chunk = Bytes::from(vec![b'o'; 32 * 1024]);
            while output.write(chunk.clone()).await.is_ok() {}
        });
        // Output fills the socket and the queue; the answers to pings then have no room
        // either, and the client reads none of it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for id in 0..200u32 {
            client.send(Frame::Ping { id: 2 * id + 1 }).await;
        }
        tokio::time::timeout(Duration::from_secs(10), writer)
            .await
            .expect("the output writer was left waiting")
            .unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(5), conn.accept()).await;
        assert!(accepted.expect("the connection stayed open").is_none());
        drop(client);
    }

    #[tokio::test]
    async fn the_connection_ending_ends_every_stream() {
        let (mut conn, mut client) = pair(Duration::from_secs(60));
        client.open(1, "stdin").await;
        client.open(3, "stdout").await;
        let mut first = conn.accept().await.unwrap();
        let second = conn.accept().await.unwrap();
        assert_eq!(conn.open_streams(), 2);
        drop(client);
        assert_eq!(first.input.recv().await, None);
        second.output.closed().await;
        assert!(conn.accept().await.is_none());
        assert_eq!(conn.open_streams(), 0);
    }
}
