//! Clients for the stream server, as kubelet and crictl use it: an HTTP upgrade to SPDY/3.1
//! (frames from crius's codec, the client side of it) and WebSocket (tokio-tungstenite).

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use crius::streaming::spdy::{Frame, SpdyCodec, header};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite};

const FIN: u8 = 0x01;
const WAIT: Duration = Duration::from_secs(30);

/// An HTTP answer that was not an upgrade.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

/// Splits `http://host:port/path` into the address and the path.
pub fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let slash = rest.find('/').expect("a path");
    (rest[..slash].to_string(), rest[slash..].to_string())
}

/// Sends an upgrade request; returns the stream after `101`, or what came instead.
async fn upgrade(
    url: &str,
    method: &str,
    extra_headers: &[(&str, &str)],
) -> Result<(TcpStream, HashMap<String, String>, BytesMut), Refused> {
    let (addr, path) = split_url(url);
    let mut tcp = TcpStream::connect(&addr)
        .await
        .expect("connect to the stream server");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in extra_headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes())
        .await
        .expect("send request");
    let mut buffer = BytesMut::new();
    let end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = tokio::time::timeout(WAIT, tcp.read_buf(&mut buffer))
            .await
            .expect("response in time")
            .expect("read response");
        assert!(n > 0, "connection closed before the response headers");
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let _ = buffer.split_to(end + 4);
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    if status == 101 {
        return Ok((tcp, headers, buffer));
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    while buffer.len() < length {
        if tcp.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
            break;
        }
    }
    Err(Refused {
        status,
        headers,
        body: String::from_utf8_lossy(&buffer).into_owned(),
    })
}

/// The client end of a SPDY connection.
pub struct SpdyClient {
    read: FramedRead<OwnedReadHalf, SpdyCodec>,
    write: FramedWrite<OwnedWriteHalf, SpdyCodec>,
    next_id: u32,
    pub protocol: String,
}

impl SpdyClient {
    /// Upgrades `url` to SPDY offering `protocols` in order.
    pub async fn connect(url: &str, protocols: &[&str]) -> Result<Self, Refused> {
        let mut headers = vec![("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")];
        for protocol in protocols {
            headers.push(("X-Stream-Protocol-Version", protocol));
        }
        let (tcp, response, leftover) = upgrade(url, "POST", &headers).await?;
        let (read_half, write_half) = tcp.into_split();
        let mut read = FramedRead::new(read_half, SpdyCodec::new());
        read.read_buffer_mut().extend_from_slice(&leftover);
        Ok(Self {
            read,
            write: FramedWrite::new(write_half, SpdyCodec::new()),
            next_id: 1,
            protocol: response
                .get("x-stream-protocol-version")
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Opens a stream with these headers; returns its id.
    pub async fn open(&mut self, headers: &[(&str, &str)]) -> u32 {
        let id = self.next_id;
        self.next_id += 2;
        self.write
            .send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
                    .collect(),
            })
            .await
            .expect("send SYN_STREAM");
        id
    }

    pub async fn send(&mut self, stream_id: u32, data: &[u8], fin: bool) {
        self.write
            .send(Frame::Data {
                stream_id,
                flags: if fin { FIN } else { 0 },
                data: Bytes::copy_from_slice(data),
            })
            .await
            .expect("send data");
    }

    pub async fn reset(&mut self, stream_id: u32) {
        self.write
            .send(Frame::RstStream {
                stream_id,
                status: 5,
            })
            .await
            .expect("send RST_STREAM");
    }

    /// The next frame, `None` when the server closed the connection.
    pub async fn next(&mut self) -> Option<Frame> {
        match tokio::time::timeout(WAIT, self.read.next()).await {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(_) => None,
            Err(_) => panic!("no frame from the server within {WAIT:?}"),
        }
    }

    /// Reads until every stream in `streams` is finished (FIN or reset) or the connection
    /// ends; returns the data per stream and which were reset.
    pub async fn collect(&mut self, streams: &[u32]) -> Collected {
        let mut collected = Collected::default();
        let mut open: Vec<u32> = streams.to_vec();
        while !open.is_empty() {
            let Some(frame) = self.next().await else {
                break;
            };
            match frame {
                Frame::Data {
                    stream_id,
                    flags,
                    data,
                } => {
                    collected
                        .data
                        .entry(stream_id)
                        .or_default()
                        .extend_from_slice(&data);
                    if flags & FIN != 0 {
                        open.retain(|id| *id != stream_id);
                    }
                }
                Frame::RstStream { stream_id, .. } => {
                    collected.reset.push(stream_id);
                    open.retain(|id| *id != stream_id);
                }
                Frame::GoAway { .. } => collected.goaway = true,
                _ => {}
            }
        }
        collected
    }

    /// Closes the connection the way a client hangs up.
    pub async fn close(mut self) {
        let _ = self.write.get_mut().shutdown().await;
    }
}

#[derive(Debug, Default)]
pub struct Collected {
    pub data: HashMap<u32, Vec<u8>>,
    pub reset: Vec<u32>,
    pub goaway: bool,
}

impl Collected {
    pub fn text(&self, stream_id: u32) -> String {
        String::from_utf8_lossy(
            self.data
                .get(&stream_id)
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .into_owned()
    }
}

/// What an exec or attach session produced.
#[derive(Debug, Default)]
pub struct SessionOutput {
    pub stdout: String,
    pub stderr: String,
    /// The error stream: the status JSON from v4 on.
    pub error: String,
}

impl SessionOutput {
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.error)
            .unwrap_or_else(|e| panic!("status {:?} is not JSON: {e}", self.error))
    }
}

/// How a SPDY exec/attach session is driven.
#[derive(Default)]
pub struct SessionInput<'a> {
    pub stdin: Option<&'a [u8]>,
    /// Close stdin after sending it.
    pub close_stdin: bool,
    pub tty: bool,
    pub stderr: bool,
    pub resize: Option<(u16, u16)>,
    /// Wait this long before sending stdin.
    pub stdin_delay: Duration,
}

/// Runs a SPDY exec/attach session with v4 and returns its output.
pub async fn spdy_session(url: &str, input: SessionInput<'_>) -> SessionOutput {
    let mut client = SpdyClient::connect(url, &["v4.channel.k8s.io"])
        .await
        .expect("upgrade to SPDY");
    assert_eq!(client.protocol, "v4.channel.k8s.io");
    let error = client.open(&[("streamType", "error")]).await;
    let stdin = if input.stdin.is_some() {
        Some(client.open(&[("streamType", "stdin")]).await)
    } else {
        None
    };
    let stdout = client.open(&[("streamType", "stdout")]).await;
    let stderr = if input.stderr && !input.tty {
        Some(client.open(&[("streamType", "stderr")]).await)
    } else {
        None
    };
    let resize = if input.tty {
        Some(client.open(&[("streamType", "resize")]).await)
    } else {
        None
    };
    if let (Some(resize), Some((width, height))) = (resize, input.resize) {
        let size = format!("{{\"Width\":{width},\"Height\":{height}}}\n");
        client.send(resize, size.as_bytes(), false).await;
    }
    if let (Some(stdin), Some(data)) = (stdin, input.stdin) {
        tokio::time::sleep(input.stdin_delay).await;
        if !data.is_empty() {
            client.send(stdin, data, false).await;
        }
        if input.close_stdin {
            client.send(stdin, &[], true).await;
        }
    }
    let mut streams = vec![error, stdout];
    streams.extend(stderr);
    let collected = client.collect(&streams).await;
    client.close().await;
    SessionOutput {
        stdout: collected.text(stdout),
        stderr: stderr.map(|s| collected.text(s)).unwrap_or_default(),
        error: collected.text(error),
    }
}

/// One forwarded connection over a port-forward session: sends `request` on the data
/// stream (then FIN) and returns (data, error) as received.
pub async fn forward_once(
    client: &mut SpdyClient,
    port: u16,
    request_id: u32,
    request: &[u8],
) -> (String, String) {
    let port = port.to_string();
    let request_id = request_id.to_string();
    let error = client
        .open(&[
            ("streamType", "error"),
            ("port", &port),
            ("requestID", &request_id),
        ])
        .await;
    let data = client
        .open(&[
            ("streamType", "data"),
            ("port", &port),
            ("requestID", &request_id),
        ])
        .await;
    client.send(data, request, true).await;
    let collected = client.collect(&[data, error]).await;
    (collected.text(data), collected.text(error))
}

pub type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;
pub use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Opens a WebSocket to `url` offering `protocols`; returns it and the chosen protocol.
pub async fn websocket(url: &str, protocols: &[&str]) -> (WebSocket, Option<String>) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let ws_url = url.replacen("http://", "ws://", 1);
    let mut request = ws_url.into_client_request().expect("a websocket request");
    if !protocols.is_empty() {
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            protocols.join(", ").parse().expect("header value"),
        );
    }
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket handshake");
    let protocol = response
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (socket, protocol)
}

/// Reads channel messages until the server closes; returns the bytes per channel.
pub async fn ws_collect(socket: &mut WebSocket) -> HashMap<u8, Vec<u8>> {
    let mut channels: HashMap<u8, Vec<u8>> = HashMap::new();
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("a websocket message in time");
        match message {
            Some(Ok(WsMessage::Binary(data))) => {
                if let Some((channel, rest)) = data.split_first() {
                    channels
                        .entry(*channel)
                        .or_default()
                        .extend_from_slice(rest);
                }
            }
            Some(Ok(WsMessage::Text(text))) => {
                use base64::Engine;
                let bytes = text.as_bytes();
                if let Some((digit, rest)) = bytes.split_first() {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(rest)
                        .expect("base64 payload");
                    channels
                        .entry(digit - b'0')
                        .or_default()
                        .extend_from_slice(&decoded);
                }
            }
            Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
    channels
}

/// The stream types a frame's headers name.
pub fn stream_type(headers: &crius::streaming::spdy::Headers) -> Option<&str> {
    header(headers, "streamType")
}
