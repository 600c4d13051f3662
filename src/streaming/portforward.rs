//! port-forward over SPDY (`portforward.k8s.io`): every forwarded connection arrives as an
//! `error` and a `data` stream with the same `requestID` and a `port`; crius connects to
//! that port in the pod and copies both ways.
//!
//! One connection forwards at most [`MAX_FORWARDS`] connections at once; past that, a new
//! pair is reset without a message (a message on the error stream would make kubectl end
//! the whole port-forward). Connecting into pods (a thread each, to enter the pod's
//! network namespace) is bounded per connection and across the whole stream server by the
//! [`Connecting`] limit it shares, and a connect waits for its turn only so long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::spdy::{SpdyConnection, SpdyStream, StreamOutput, header};
use super::{RuntimeError, StreamRuntime};

pub const PROTOCOL: &str = "portforward.k8s.io";
/// How long the second stream of a pair may take to arrive.
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// After the pod closed its side, how long data from the client may still be delivered.
const CLIENT_DRAIN: Duration = Duration::from_secs(1);
const READ_BUFFER: usize = 32 * 1024;
/// Connections one port-forward connection forwards at once.
pub const MAX_FORWARDS: usize = 128;
/// Streams one port-forward connection may have open: two per forward, and pairs the
/// client has half opened.
pub const MAX_STREAMS: usize = 2 * MAX_FORWARDS + 8;
/// Connects into pods in flight across the whole stream server.
pub const MAX_CONNECTING: usize = 16;
/// Connects into pods in flight for one port-forward connection, so one client with a pod
/// that never answers cannot take every place.
const MAX_CONNECTING_PER_CONNECTION: usize = 4;
/// How long a connect waits for a place before it fails.
const CONNECT_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// The stream server's bound on connects in flight, shared by every connection.
#[derive(Clone)]
pub struct Connecting(Arc<Semaphore>);

impl Default for Connecting {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(MAX_CONNECTING)))
    }
}

#[derive(Default)]
struct PendingPair {
    error: Option<SpdyStream>,
    data: Option<SpdyStream>,
    since: Option<Instant>,
}

/// Serves a port-forward connection until the client hangs up.
pub async fn serve(
    mut conn: SpdyConnection,
    sandbox_id: String,
    runtime: Arc<dyn StreamRuntime>,
    connecting: Connecting,
    shutdown: CancellationToken,
) {
    let mut pending: HashMap<String, PendingPair> = HashMap::new();
    let mine = Arc::new(Semaphore::new(MAX_CONNECTING_PER_CONNECTION));
    let mut forwards = JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            stream = conn.accept() => {
                let Some(stream) = stream else { break };
                if let Some((error, data)) = pair_up(&mut pending, stream).await {
                    if forwards.len() >= MAX_FORWARDS {
                        refuse(error.output, data.output).await;
                        continue;
                    }
                    let runtime = runtime.clone();
                    let sandbox_id = sandbox_id.clone();
                    let places = Places {
                        server: connecting.clone(),
                        connection: mine.clone(),
                    };
                    forwards.spawn(async move {
                        forward(runtime, &sandbox_id, &places, error, data).await;
                    });
                }
            }
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
            _ = sweep.tick(), if !pending.is_empty() => expire_pairs(&mut pending).await,
            _ = shutdown.cancelled() => break,
        }
    }
    forwards.shutdown().await;
    for (_, pair) in pending.drain() {
        for stream in [pair.error, pair.data].into_iter().flatten() {
            stream.output.reset().await;
        }
    }
    conn.close().await;
}

/// The request id of a stream; old clients sent none and paired streams by id.
fn request_id(stream: &SpdyStream, stream_type: &str) -> String {
    match header(&stream.headers, "requestID") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ if stream_type == "data" => stream.id.saturating_sub(2).to_string(),
        _ => stream.id.to_string(),
    }
}

/// Files the stream under its request; returns the pair once both halves are there.
async fn pair_up(
    pending: &mut HashMap<String, PendingPair>,
    stream: SpdyStream,
) -> Option<(SpdyStream, SpdyStream)> {
    let stream_type = header(&stream.headers, "streamType")
        .unwrap_or_default()
        .to_string();
    if stream_type != "error" && stream_type != "data" {
        tracing::debug!(stream_type, "unexpected port-forward stream");
        stream.output.reset().await;
        return None;
    }
    let id = request_id(&stream, &stream_type);
    let pair = pending.entry(id.clone()).or_default();
    pair.since.get_or_insert_with(Instant::now);
    let slot = if stream_type == "error" {
        &mut pair.error
    } else {
        &mut pair.data
    };
    if slot.is_some() {
        tracing::debug!(request = %id, stream_type, "duplicate port-forward stream");
        stream.output.reset().await;
        return None;
    }
    *slot = Some(stream);
    if pair.error.is_some() && pair.data.is_some() {
        let pair = pending.remove(&id)?;
        return Some((pair.error?, pair.data?));
    }
    None
}

/// Turns a forward away: the connection already forwards as many as it may. Both streams
/// are reset without a message, so the client drops this one connection only.
async fn refuse(error: StreamOutput, data: StreamOutput) {
    tracing::debug!(
        limit = MAX_FORWARDS,
        "too many forwarded connections on one port-forward connection"
    );
    data.reset().await;
    error.reset().await;
}

/// Gives up on pairs whose other half never came.
async fn expire_pairs(pending: &mut HashMap<String, PendingPair>) {
    let expired: Vec<String> = pending
        .iter()
        .filter(|(_, pair)| pair.since.is_some_and(|t| t.elapsed() > PAIR_TIMEOUT))
        .map(|(id, _)| id.clone())
        .collect();
    for id in expired {
        let Some(pair) = pending.remove(&id) else {
            continue;
        };
        tracing::debug!(request = %id, "port-forward stream pair incomplete; giving up");
        if let Some(error) = &pair.error {
            let message = format!("timed out waiting for the data stream of request {id}");
            let _ = error.output.write(message.into()).await;
        }
        for stream in [pair.error, pair.data].into_iter().flatten() {
            stream.output.reset().await;
        }
    }
}

/// Forwards one connection: errors go to the error stream, bytes over the data stream.
async fn forward(
    runtime: Arc<dyn StreamRuntime>,
    sandbox_id: &str,
    places: &Places,
    error: SpdyStream,
    mut data: SpdyStream,
) {
    // The client sends nothing on the error stream: refuse what it does send.
    let SpdyStream {
        input: error_input,
        output: error,
        ..
    } = error;
    drop(error_input);
    let port = header(&data.headers, "port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0);
    let result = match port {
        None => Err(format!(
            "invalid port {:?}",
            header(&data.headers, "port").unwrap_or_default()
        )),
        Some(port) => match connect(runtime.clone(), sandbox_id, port, places).await {
            Ok(tcp) => copy_both_ways(tcp, &mut data).await,
            Err(e) => Err(format!(
                "failed to connect to localhost:{port} in sandbox {sandbox_id}: {e}"
            )),
        },
    };
    match result {
        Ok(()) => {
            data.output.close().await;
            error.close().await;
        }
        Err(message) => {
            tracing::debug!(sandbox = sandbox_id, error = %message, "port-forward failed");
            let _ = error.write(message.into()).await;
            error.close().await;
            data.output.reset().await;
            error.reset().await;
        }
    }
}

/// Where a forward may connect: a place of its connection's and one of the server's.
struct Places {
    server: Connecting,
    connection: Arc<Semaphore>,
}

impl Places {
    async fn take(&self) -> Result<[OwnedSemaphorePermit; 2], RuntimeError> {
        let take = async {
            let mine = self.connection.clone().acquire_owned().await?;
            let server = self.server.0.clone().acquire_owned().await?;
            Ok::<_, tokio::sync::AcquireError>([mine, server])
        };
        match tokio::time::timeout(CONNECT_QUEUE_TIMEOUT, take).await {
            Ok(Ok(permits)) => Ok(permits),
            Ok(Err(_)) => Err(RuntimeError::new("the stream server is stopping")),
            Err(_) => Err(RuntimeError::new(format!(
                "too many port-forward connects in flight; none finished within {CONNECT_QUEUE_TIMEOUT:?}"
            ))),
        }
    }
}

/// Connects to the pod's port once the connect limits let it. The connect runs in a task
/// of its own that holds its places to the end, so a forward that is dropped meanwhile does
/// not free a place while its connect thread still runs.
async fn connect(
    runtime: Arc<dyn StreamRuntime>,
    sandbox_id: &str,
    port: u16,
    places: &Places,
) -> Result<tokio::net::TcpStream, RuntimeError> {
    let permits = places.take().await?;
    let sandbox_id = sandbox_id.to_string();
    tokio::spawn(async move {
        let _permits = permits;
        runtime.port_forward(&sandbox_id, port).await
    })
    .await
    .map_err(|e| RuntimeError::new(format!("the connect task failed: {e}")))?
}

/// Copies until the pod closes its side (then gives the client's last bytes a moment), or
/// until the client closes its side and the pod has answered everything.
async fn copy_both_ways(tcp: tokio::net::TcpStream, data: &mut SpdyStream) -> Result<(), String> {
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let output = data.output.clone();
    let to_client = async move {
        let mut buf = BytesMut::with_capacity(READ_BUFFER);
        loop {
            buf.reserve(READ_BUFFER);
            match from_pod.read_buf(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    if output.write(buf.split().freeze()).await.is_err() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(format!("reading from the pod: {e}")),
            }
        }
    };
    let input = &mut data.input;
    let to_pod_copy = async move {
        while let Some(chunk) = input.recv().await {
            if let Err(e) = to_pod.write_all(&chunk).await {
                return Err(format!("writing to the pod: {e}"));
            }
        }
        // The client is done sending: pass the half-close on.
        let _ = to_pod.shutdown().await;
        Ok(())
    };
    tokio::pin!(to_client);
    tokio::pin!(to_pod_copy);
    let reset = data.output.clone();
    tokio::select! {
        done = &mut to_client => {
            // The pod hung up: what the client still sends has a moment to arrive.
            let _ = tokio::time::timeout(CLIENT_DRAIN, &mut to_pod_copy).await;
            done
        }
        sent = &mut to_pod_copy => {
            sent?;
            tokio::select! {
                done = &mut to_client => done,
                _ = reset.closed() => Ok(()),
            }
        }
        _ = reset.closed() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::{SinkExt, StreamExt};
    use tokio_util::codec::{FramedRead, FramedWrite};

    use super::*;
    use crate::streaming::spdy::{Frame, SpdyCodec};
    use crate::streaming::{ProcessIo, RuntimeError};

    /// Connects every forward to one local listener, slowly, counting connects in flight.
    struct SlowRuntime {
        addr: std::net::SocketAddr,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl StreamRuntime for SlowRuntime {
        async fn exec(
            &self,
            _: &str,
            _: &[String],
            _: ProcessIo,
            _: CancellationToken,
        ) -> Result<i32, RuntimeError> {
            Err(RuntimeError::new("not in this test"))
        }

        async fn attach(
            &self,
            _: &str,
            _: ProcessIo,
            _: CancellationToken,
        ) -> Result<(), RuntimeError> {
            Err(RuntimeError::new("not in this test"))
        }

        async fn port_forward(
            &self,
            _: &str,
            _: u16,
        ) -> Result<tokio::net::TcpStream, RuntimeError> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|e| RuntimeError::new(e.to_string()))
        }
    }

    #[tokio::test]
    async fn forwards_per_connection_and_connects_in_flight_are_bounded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The pod side: takes connections and holds them open.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let runtime = Arc::new(SlowRuntime {
            addr,
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let (server, client) = tokio::io::duplex(1 << 20);
        let conn = SpdyConnection::new(server, Duration::from_secs(60), MAX_STREAMS, None);
        let serving = tokio::spawn(serve(
            conn,
            "pod".into(),
            runtime.clone(),
            Connecting::default(),
            CancellationToken::new(),
        ));
        let (read, write) = tokio::io::split(client);
        let mut read = FramedRead::new(read, SpdyCodec::new());
        let mut write = FramedWrite::new(write, SpdyCodec::new());
        let pairs = MAX_FORWARDS as u32 + 1;
        for request in 0..pairs {
            for (i, stream_type) in ["error", "data"].into_iter().enumerate() {
                write
                    .send(Frame::SynStream {
                        stream_id: 4 * request + 2 * i as u32 + 1,
                        associated_to: 0,
                        priority: 0,
                        flags: 0,
                        headers: vec![
                            ("streamtype".into(), stream_type.into()),
                            ("port".into(), "80".into()),
                            ("requestid".into(), request.to_string()),
                        ],
                    })
                    .await
                    .unwrap();
            }
        }
        // The last pair is turned away: both its streams reset, nothing on its error stream
        // (kubectl would end the whole port-forward over a message there).
        let last_error = 4 * (pairs - 1) + 1;
        let mut reset = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(Ok(frame)) = read.next().await {
                match frame {
                    Frame::RstStream { stream_id, .. } => {
                        reset.push(stream_id);
                        if reset.contains(&last_error) && reset.contains(&(last_error + 2)) {
                            return;
                        }
                    }
                    Frame::Data {
                        stream_id, data, ..
                    } => assert!(
                        stream_id != last_error || data.is_empty(),
                        "a message on the refused pair's error stream: {data:?}"
                    ),
                    _ => {}
                }
            }
        })
        .await
        .expect("the last pair reset in time");
        assert_eq!(
            reset.len(),
            2,
            "only the pair past the limit was reset: {reset:?}"
        );
        let most = runtime.most_in_flight.load(Ordering::SeqCst);
        assert!(
            (2..=MAX_CONNECTING_PER_CONNECTION).contains(&most),
            "{most} connects in flight at once for one connection"
        );
        drop(write);
        drop(read);
        tokio::time::timeout(Duration::from_secs(10), serving)
            .await
            .expect("the session ends with its client")
            .unwrap();
    }
}
