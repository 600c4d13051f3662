//! The metrics listener: `GET /metrics` over plain HTTP/1.1 on `[metrics] address`.
//!
//! Whoever reaches the address may scrape, so it is bounded like the stream server: a few
//! connections at a time, a deadline for the request head, and nothing but the one path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Scrapers served at once; more connections are closed at once.
const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one connection may stay open. One request per connection: a client cannot
/// hold a slot and ask again and again.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// A bound metrics listener, not serving yet.
pub struct MetricsServer {
    listener: TcpListener,
    local: SocketAddr,
}

impl MetricsServer {
    pub async fn bind(addr: &str) -> Result<Self, ServeError> {
        let bind_error = |source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        Ok(Self { listener, local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves scrapes until `shutdown` fires.
    pub async fn serve(self, shutdown: CancellationToken) {
        tracing::info!(address = %self.local, "serving metrics at /metrics");
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        if connections.len() >= MAX_CONNECTIONS {
                            tracing::debug!(%peer, "metrics listener full: connection closed");
                            continue;
                        }
                        connections.spawn(serve_connection(tcp, peer));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a metrics connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        connections.abort_all();
    }
}

async fn serve_connection(tcp: tokio::net::TcpStream, peer: SocketAddr) {
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(tcp), service_fn(answer));
    match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection failed"),
        Err(_) => tracing::debug!(%peer, "metrics connection open too long: closed"),
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() != "/metrics" {
        return Ok(plain(StatusCode::NOT_FOUND, "only /metrics is served\n"));
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"));
    }
    let response = match super::metrics().encode() {
        Ok(text) => Response::builder()
            .header(header::CONTENT_TYPE, OPENMETRICS)
            .body(Full::new(Bytes::from(text))),
        Err(e) => {
            tracing::warn!(error = %e, "encoding metrics failed");
            Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(Full::new(Bytes::from_static(b"encoding metrics failed\n")))
        }
    };
    Ok(response.unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")))
}

fn plain(status: StatusCode, message: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(message.as_bytes())));
    *response.status_mut() = status;
    response
}
