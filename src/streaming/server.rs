//! The HTTP side: listening (optionally with TLS), routing `/exec|/attach|/portforward/{token}`,
//! upgrading to SPDY/3.1 or WebSocket, and stopping within a bound.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, Ticket};
use super::peer::{PeerFd, PeerSocket};
use super::remotecommand::{self, ChannelProtocol, Command, StdioOptions};
use super::spdy::SpdyConnection;
use super::websocket::{self, WsProtocol};
use super::{StreamRequest, StreamRequests, StreamRuntime, portforward};
use crate::config::StreamConfig;

const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
const ACCEPTED_PROTOCOLS_HEADER: &str = "x-accepted-stream-protocol-versions";
const SPDY_UPGRADE: &str = "SPDY/3.1";
/// The most of a request crius buffers while it reads one (a stream request is a line and
/// a few headers).
const MAX_REQUEST_BUFFER: usize = 16 * 1024;
/// How long stopping waits for open sessions.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum StreamServerError {
    #[error("binding the stream server to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("stream server TLS: {0}")]
    Tls(String),
}

/// What the handlers share.
struct ServerState {
    requests: Arc<StreamRequests>,
    runtime: Arc<dyn StreamRuntime>,
    idle_timeout: Duration,
    /// How long a connection has for its TLS handshake and a request with a valid token.
    request_timeout: Duration,
    /// Connections and sessions held at once, so a flood cannot take every descriptor.
    max_connections: usize,
    /// Connections not yet admitted, which a full server closes, oldest first.
    admission: Arc<Admission>,
    /// Upgraded sessions, which outlive their HTTP request.
    sessions: TaskTracker,
    /// Port-forward connects in flight, across all sessions.
    connecting: portforward::Connecting,
    shutdown: CancellationToken,
}

/// The server as the rest of crius sees it.
#[derive(Clone)]
pub struct StreamEndpoint {
    pub base_url: String,
    sessions: TaskTracker,
}

impl StreamEndpoint {
    /// Upgraded exec, attach and port-forward connections still open.
    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }
}

/// A bound stream server, not serving yet.
pub struct StreamServer {
    listener: TcpListener,
    base_url: String,
    tls: Option<TlsAcceptor>,
    state: Arc<ServerState>,
}

impl StreamServer {
    /// Binds the configured address and port (0 picks a free port) and prepares TLS.
    pub async fn bind(
        config: &StreamConfig,
        requests: Arc<StreamRequests>,
        runtime: Arc<dyn StreamRuntime>,
    ) -> Result<Self, StreamServerError> {
        let addr = format!("{}:{}", bracket_ipv6(&config.address), config.port);
        let listener =
            TcpListener::bind(&addr)
                .await
                .map_err(|source| StreamServerError::Bind {
                    addr: addr.clone(),
                    source,
                })?;
        let local = listener
            .local_addr()
            .map_err(|source| StreamServerError::Bind { addr, source })?;
        let tls = if config.tls {
            Some(tls_acceptor(config, local)?)
        } else {
            None
        };
        let base_url = base_url(local, tls.is_some());
        Ok(Self {
            listener,
            base_url,
            tls,
            state: Arc::new(ServerState {
                requests,
                runtime,
                idle_timeout: config.idle_timeout,
                request_timeout: config.request_timeout,
                max_connections: config.max_connections,
                admission: Arc::new(Admission::default()),
                sessions: TaskTracker::new(),
                connecting: portforward::Connecting::default(),
                shutdown: CancellationToken::new(),
            }),
        })
    }

    /// `http://host:port` (or `https`), what the RPCs put in front of `/exec/<token>`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// What the RPCs and `Status` need to know of the server.
    pub fn endpoint(&self) -> StreamEndpoint {
        StreamEndpoint {
            base_url: self.base_url.clone(),
            sessions: self.state.sessions.clone(),
        }
    }

    /// Serves until `shutdown` fires, then closes every connection and session within a
    /// short bound.
    pub async fn serve(self, shutdown: CancellationToken) {
        let router = router(self.state.clone());
        let mut connections = JoinSet::new();
        tracing::info!(url = %self.base_url, "stream server listening");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        if !self.make_room() {
                            tracing::debug!(%peer, "stream server full of sessions: connection closed");
                            drop(tcp);
                            continue;
                        }
                        let _ = tcp.set_nodelay(true);
                        let ticket = Arc::new(self.state.admission.ticket());
                        connections.spawn(serve_connection(
                            tcp,
                            peer,
                            self.tls.clone(),
                            router.clone(),
                            ticket,
                            self.state.request_timeout,
                        ));
                    }
                    Err(e) => {
                        // Out of descriptors and the like: wait a little rather than spin.
                        tracing::warn!(error = %e, "accepting a stream connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        connections.abort_all();
        self.state.shutdown.cancel();
        self.state.sessions.close();
        if tokio::time::timeout(STOP_GRACE, self.state.sessions.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                sessions = self.state.sessions.len(),
                "stream sessions still open after the stop grace"
            );
        }
        while connections.join_next().await.is_some() {}
        tracing::info!("stream server stopped");
    }
}

impl StreamServer {
    /// Makes a place for one more connection, closing the oldest connections that have not
    /// presented a request yet; false when every place holds a session or an admitted
    /// request, which are never closed for a newcomer.
    fn make_room(&self) -> bool {
        let state = &self.state;
        while state.admission.occupied() + state.sessions.len() >= state.max_connections {
            if !state.admission.evict_oldest() {
                return false;
            }
        }
        true
    }
}

fn bracket_ipv6(address: &str) -> String {
    if address.contains(':') {
        format!("[{address}]")
    } else {
        address.to_string()
    }
}

/// The URL clients reach the server at. An unspecified bind address is reached over the
/// loopback of its family, since kubelet runs on the same node.
fn base_url(local: SocketAddr, tls: bool) -> String {
    let mut addr = local;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

/// Serves one connection. Until it is admitted (a request with a valid token), it is
/// closed when a full server needs its place or when `request_timeout` has passed since
/// accept (TLS handshake included), however slowly its bytes come.
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    router: Router,
    ticket: Arc<Ticket>,
    request_timeout: Duration,
) {
    // Sessions watch the socket for a hang-up while they cannot read it.
    let router = router
        .layer(axum::Extension(PeerFd(tcp.as_raw_fd())))
        .layer(axum::Extension(ticket.clone()));
    let serving = async {
        match tls {
            None => serve_http(tcp, peer, router, request_timeout).await,
            Some(acceptor) => match acceptor.accept(tcp).await {
                Ok(stream) => serve_http(stream, peer, router, request_timeout).await,
                Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
            },
        }
    };
    tokio::pin!(serving);
    tokio::select! {
        _ = &mut serving => return,
        _ = ticket.evicted() => {
            tracing::debug!(%peer, "stream connection without a request closed to make room");
            return;
        }
        _ = tokio::time::sleep(request_timeout) => {}
    }
    if !ticket.is_admitted() {
        tracing::debug!(%peer, "no stream request in time: connection closed");
        return;
    }
    serving.await;
}

async fn serve_http<S>(io: S, peer: SocketAddr, router: Router, request_timeout: Duration)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(request_timeout)
        .max_buf_size(MAX_REQUEST_BUFFER)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router))
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "stream connection ended with an error");
    }
}

fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/exec/{token}", get(exec).post(exec))
        .route("/attach/{token}", get(attach).post(attach))
        .route("/portforward/{token}", get(port_forward).post(port_forward))
        .layer(axum::middleware::map_response(close_unless_upgraded))
        .with_state(state)
}

/// One request a connection unless it becomes a stream: a URL is good once, and a
/// connection kept alive with a request now and then (each a 404) would hold one of the
/// server's places for ever. (Keep-alive itself stays on: without it hyper would answer an
/// upgrade with `Connection: close`.)
async fn close_unless_upgraded(mut response: Response) -> Response {
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    (status, message.into()).into_response()
}

fn unknown_token() -> Response {
    plain(
        StatusCode::NOT_FOUND,
        "unknown, used or expired stream token",
    )
}

async fn exec(
    State(state): State<Arc<ServerState>>,
    UrlPath(token): UrlPath<String>,
    request: Request,
) -> Response {
    if let Some(closed) = refuse_unless_admitted(&request) {
        return closed;
    }
    let Some(StreamRequest::Exec(exec)) = state.requests.take(&token) else {
        return unknown_token();
    };
    let options = StdioOptions {
        stdin: exec.stdin,
        stdout: exec.stdout,
        stderr: exec.stderr,
        tty: exec.tty,
    };
    let command = Command::Exec {
        container_id: exec.container_id,
        cmd: exec.cmd,
    };
    upgrade_remote_command(state, request, options, command).await
}

async fn attach(
    State(state): State<Arc<ServerState>>,
    UrlPath(token): UrlPath<String>,
    request: Request,
) -> Response {
    if let Some(closed) = refuse_unless_admitted(&request) {
        return closed;
    }
    let Some(StreamRequest::Attach(attach)) = state.requests.take(&token) else {
        return unknown_token();
    };
    let options = StdioOptions {
        stdin: attach.stdin,
        stdout: attach.stdout,
        stderr: attach.stderr,
        tty: attach.tty,
    };
    let command = Command::Attach {
        container_id: attach.container_id,
    };
    upgrade_remote_command(state, request, options, command).await
}

async fn port_forward(
    State(state): State<Arc<ServerState>>,
    UrlPath(token): UrlPath<String>,
    mut request: Request,
) -> Response {
    if let Some(closed) = refuse_unless_admitted(&request) {
        return closed;
    }
    let Some(StreamRequest::PortForward(forward)) = state.requests.take(&token) else {
        return unknown_token();
    };
    if is_websocket(request.headers()) {
        return plain(
            StatusCode::BAD_REQUEST,
            "port-forward is served over SPDY/3.1 only",
        );
    }
    let protocol = match negotiate_spdy(request.headers(), &[portforward::PROTOCOL]) {
        Ok(protocol) => protocol,
        Err(refusal) => return refusal.into_response(),
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let peer = peer_socket(&request);
    let idle_timeout = state.idle_timeout;
    let runtime = state.runtime.clone();
    let connecting = state.connecting.clone();
    let shutdown = state.shutdown.clone();
    state.sessions.spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let _open = crate::metrics::metrics().stream_session_opened("port_forward");
                let conn = SpdyConnection::new(
                    TokioIo::new(upgraded),
                    idle_timeout,
                    portforward::MAX_STREAMS,
                    peer,
                );
                portforward::serve(conn, forward.pod_sandbox_id, runtime, connecting, shutdown)
                    .await;
            }
            Err(e) => tracing::debug!(error = %e, "port-forward upgrade failed"),
        }
    });
    switching_to_spdy(protocol)
}

async fn upgrade_remote_command(
    state: Arc<ServerState>,
    request: Request,
    options: StdioOptions,
    command: Command,
) -> Response {
    if is_websocket(request.headers()) {
        return upgrade_websocket(state, request, options, command).await;
    }
    let mut request = request;
    let protocol = match negotiate_spdy(request.headers(), &ChannelProtocol::SPDY) {
        Ok(protocol) => protocol,
        Err(refusal) => return refusal.into_response(),
    };
    let Some(version) = ChannelProtocol::from_name(protocol) else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "protocol mismatch");
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let peer = peer_socket(&request);
    let idle_timeout = state.idle_timeout;
    let runtime = state.runtime.clone();
    let shutdown = state.shutdown.clone();
    state.sessions.spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let _open = crate::metrics::metrics().stream_session_opened(command.kind());
                let conn = SpdyConnection::new(
                    TokioIo::new(upgraded),
                    idle_timeout,
                    remotecommand::MAX_STREAMS,
                    peer,
                );
                remotecommand::serve(conn, version, options, command, runtime, shutdown).await;
            }
            Err(e) => tracing::debug!(error = %e, "stream upgrade failed"),
        }
    });
    switching_to_spdy(protocol)
}

async fn upgrade_websocket(
    state: Arc<ServerState>,
    request: Request,
    options: StdioOptions,
    command: Command,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let mut upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        // A message or frame is refused past the limit, before it is buffered whole.
        Ok(upgrade) => upgrade
            .max_message_size(websocket::MAX_MESSAGE)
            .max_frame_size(websocket::MAX_MESSAGE),
        Err(rejection) => return rejection.into_response(),
    };
    // In the client's order of preference (the extractor keeps them sorted instead).
    let offered = header_list(&parts.headers, header::SEC_WEBSOCKET_PROTOCOL.as_str());
    let protocol = if offered.is_empty() {
        WsProtocol::fallback()
    } else {
        let Some(name) = offered.iter().find(|p| WsProtocol::from_name(p).is_some()) else {
            return plain(
                StatusCode::FORBIDDEN,
                format!(
                    "none of the requested sub-protocols {offered:?} is supported; supported: {}",
                    WsProtocol::NAMES.join(", ")
                ),
            );
        };
        if let Ok(value) = HeaderValue::from_str(name) {
            upgrade.set_selected_protocol(value);
        }
        match WsProtocol::from_name(name) {
            Some(protocol) => protocol,
            None => WsProtocol::fallback(),
        }
    };
    let session = websocket::Session {
        protocol,
        options,
        command,
        runtime: state.runtime.clone(),
        shutdown: state.shutdown.clone(),
        idle_timeout: state.idle_timeout,
    };
    let sessions = state.sessions.clone();
    upgrade.on_upgrade(move |socket| {
        sessions.track_future(async move {
            let _open = crate::metrics::metrics().stream_session_opened(session.command.kind());
            session.serve(socket).await
        })
    })
}

/// Admits the request's connection (no full server closes it from now on), or, when one
/// already closed it to make room, the answer that says so; its token stays unused.
fn refuse_unless_admitted(request: &Request) -> Option<Response> {
    let ticket = request.extensions().get::<Arc<Ticket>>()?;
    (!ticket.admit()).then(|| {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the stream server closed this connection to make room: try again",
        )
    })
}

/// A duplicate of the client's socket, taken while its request is handled.
fn peer_socket(request: &Request) -> Option<PeerSocket> {
    request
        .extensions()
        .get::<PeerFd>()
        .copied()
        .and_then(PeerSocket::of_connection)
}

fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Values of a header that may be repeated and comma-separated.
fn header_list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Why an upgrade request is refused.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
    /// For `X-Accepted-Stream-Protocol-Versions`.
    accepted: Option<String>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = plain(self.status, self.message);
        if let Some(value) = self.accepted.and_then(|a| HeaderValue::from_str(&a).ok()) {
            response
                .headers_mut()
                .insert(ACCEPTED_PROTOCOLS_HEADER, value);
        }
        response
    }
}

/// Picks the first protocol the client offers that crius supports, and checks the request
/// asks for the SPDY upgrade.
fn negotiate_spdy(
    headers: &HeaderMap,
    supported: &[&'static str],
) -> Result<&'static str, Refusal> {
    let offered = header_list(headers, PROTOCOL_HEADER);
    if offered.is_empty() {
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "unable to upgrade: X-Stream-Protocol-Version is required".into(),
            accepted: None,
        });
    }
    let Some(chosen) = offered
        .iter()
        .find_map(|o| supported.iter().find(|s| **s == o.as_str()).copied())
    else {
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "unable to upgrade: none of the client's protocols {offered:?} is supported"
            ),
            accepted: Some(supported.join(", ")),
        });
    };
    let connection_upgrade = header_list(headers, header::CONNECTION.as_str())
        .iter()
        .any(|v| v.eq_ignore_ascii_case("upgrade"));
    let spdy = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(SPDY_UPGRADE));
    if !connection_upgrade || !spdy {
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "unable to upgrade: missing upgrade headers in request".into(),
            accepted: None,
        });
    }
    Ok(chosen)
}

fn switching_to_spdy(protocol: &'static str) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY_UPGRADE));
    headers.insert(PROTOCOL_HEADER, HeaderValue::from_static(protocol));
    response
}

/// TLS from the configured key pair, or a self-signed certificate for the bound address.
fn tls_acceptor(
    config: &StreamConfig,
    local: SocketAddr,
) -> Result<TlsAcceptor, StreamServerError> {
    let tls = |message: String| StreamServerError::Tls(message);
    let (certs, key) = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => load_key_pair(cert, key)?,
        (None, None) => self_signed(local)?,
        _ => {
            return Err(tls(
                "stream.tls_cert_file and stream.tls_key_file go together".into(),
            ));
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls(format!("using the certificate: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(server_config)))
}

type KeyPair = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

fn load_key_pair(cert: &Path, key: &Path) -> Result<KeyPair, StreamServerError> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StreamServerError::Tls(format!("reading {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(StreamServerError::Tls(format!(
            "{} holds no certificate",
            cert.display()
        )));
    }
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
        .map_err(|e| StreamServerError::Tls(format!("reading {}: {e}", key.display())))?;
    Ok((certs, key))
}

fn self_signed(local: SocketAddr) -> Result<KeyPair, StreamServerError> {
    let mut names = vec!["localhost".to_string()];
    names.push(local.ip().to_string());
    if local.ip().is_unspecified() {
        names.push("127.0.0.1".to_string());
    }
    if let Ok(host) = nix::unistd::gethostname()
        && let Some(host) = host.to_str()
    {
        names.push(host.to_string());
    }
    let certified = rcgen::generate_simple_self_signed(names)
        .map_err(|e| StreamServerError::Tls(format!("generating a certificate: {e}")))?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    Ok((vec![certified.cert.der().clone()], key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    const UPGRADE: [(&str, &str); 2] = [("connection", "Upgrade"), ("upgrade", "SPDY/3.1")];

    #[test]
    fn picks_the_first_supported_protocol_the_client_offers() {
        let mut map = headers(&UPGRADE);
        map.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v9.channel.k8s.io"),
        );
        map.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v3.channel.k8s.io, v4.channel.k8s.io"),
        );
        assert_eq!(
            negotiate_spdy(&map, &ChannelProtocol::SPDY).unwrap(),
            "v3.channel.k8s.io"
        );
    }

    #[test]
    fn no_protocol_is_400_and_no_match_is_403_with_the_accepted_list() {
        let response = negotiate_spdy(&headers(&UPGRADE), &ChannelProtocol::SPDY)
            .unwrap_err()
            .into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let mut map = headers(&UPGRADE);
        map.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v9.channel.k8s.io"),
        );
        let response = negotiate_spdy(&map, &[portforward::PROTOCOL])
            .unwrap_err()
            .into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            response.headers()[ACCEPTED_PROTOCOLS_HEADER],
            "portforward.k8s.io"
        );
    }

    #[test]
    fn a_request_without_the_upgrade_headers_is_400() {
        let map = headers(&[(PROTOCOL_HEADER, "portforward.k8s.io")]);
        let response = negotiate_spdy(&map, &[portforward::PROTOCOL])
            .unwrap_err()
            .into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn urls_name_a_reachable_address() {
        assert_eq!(
            base_url("0.0.0.0:1234".parse().unwrap(), false),
            "http://127.0.0.1:1234"
        );
        assert_eq!(
            base_url("[::]:80".parse().unwrap(), true),
            "https://[::1]:80"
        );
        assert_eq!(
            base_url("10.1.2.3:5".parse().unwrap(), false),
            "http://10.1.2.3:5"
        );
    }

    #[test]
    fn a_self_signed_certificate_makes_a_tls_acceptor() {
        let config = StreamConfig {
            tls: true,
            ..StreamConfig::default()
        };
        assert!(tls_acceptor(&config, "127.0.0.1:0".parse().unwrap()).is_ok());
        let half = StreamConfig {
            tls: true,
            tls_cert_file: Some("/nonexistent.pem".into()),
            ..StreamConfig::default()
        };
        assert!(tls_acceptor(&half, "127.0.0.1:0".parse().unwrap()).is_err());
    }
}
