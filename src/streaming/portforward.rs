//! port-forward over SPDY (`portforward.k8s.io`): every forwarded connection arrives as an
//! `error` and a `data` stream with the same `requestID` and a `port`; crius connects to
//! that port in the pod and copies both ways.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::StreamRuntime;
use super::spdy::{SpdyConnection, SpdyStream, header};

pub const PROTOCOL: &str = "portforward.k8s.io";
/// How long the second stream of a pair may take to arrive.
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// After the pod closed its side, how long data from the client may still be delivered.
const CLIENT_DRAIN: Duration = Duration::from_secs(1);
const READ_BUFFER: usize = 32 * 1024;

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
    shutdown: CancellationToken,
) {
    let mut pending: HashMap<String, PendingPair> = HashMap::new();
    let mut forwards = JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            stream = conn.accept() => {
                let Some(stream) = stream else { break };
                if let Some((error, data)) = pair_up(&mut pending, stream).await {
                    let runtime = runtime.clone();
                    let sandbox_id = sandbox_id.clone();
                    forwards.spawn(async move {
                        forward(runtime.as_ref(), &sandbox_id, error, data).await;
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
    runtime: &dyn StreamRuntime,
    sandbox_id: &str,
    error: SpdyStream,
    mut data: SpdyStream,
) {
    let port = header(&data.headers, "port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0);
    let result = match port {
        None => Err(format!(
            "invalid port {:?}",
            header(&data.headers, "port").unwrap_or_default()
        )),
        Some(port) => match runtime.port_forward(sandbox_id, port).await {
            Ok(tcp) => copy_both_ways(tcp, &mut data).await,
            Err(e) => Err(format!(
                "failed to connect to localhost:{port} in sandbox {sandbox_id}: {e}"
            )),
        },
    };
    match result {
        Ok(()) => {
            data.output.close().await;
            error.output.close().await;
        }
        Err(message) => {
            tracing::debug!(sandbox = sandbox_id, error = %message, "port-forward failed");
            let _ = error.output.write(message.into()).await;
            error.output.close().await;
            data.output.reset().await;
            error.output.reset().await;
        }
    }
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
