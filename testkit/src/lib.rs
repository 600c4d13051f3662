//! crius's own CRI client, used by the integration tests and benchmarks: tonic over the
//! unix socket (both API versions), and ttrpc.

use std::path::Path;

use crius::api::{v1, v1alpha2};
use hyper_util::rt::TokioIo;
use prost::Message;
use tonic::transport::{Channel, Endpoint};

use crius::server::rpc::MAX_MESSAGE_SIZE;

/// Errors of the client itself (not of the RPCs it makes).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("failed to connect to {path}: {reason}")]
    Connect { path: String, reason: String },
}

/// Opens a gRPC channel to a CRI unix socket.
pub async fn connect_channel(path: &Path) -> Result<Channel, ClientError> {
    let socket = path.to_path_buf();
    Endpoint::try_from("http://[::]")
        .map_err(|e| ClientError::Connect {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| ClientError::Connect {
            path: path.display().to_string(),
            reason: format!("{e:?}"),
        })
}

/// A CRI `v1` client over gRPC.
#[derive(Clone)]
pub struct CriClient {
    pub runtime: v1::runtime_service_client::RuntimeServiceClient<Channel>,
    pub image: v1::image_service_client::ImageServiceClient<Channel>,
}

impl CriClient {
    pub async fn connect(path: &Path) -> Result<Self, ClientError> {
        let channel = connect_channel(path).await?;
        Ok(Self {
            runtime: v1::runtime_service_client::RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE),
            image: v1::image_service_client::ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE),
        })
    }
}

/// A CRI `v1alpha2` client over gRPC.
#[derive(Clone)]
pub struct CriClientV1alpha2 {
    pub runtime: v1alpha2::runtime_service_client::RuntimeServiceClient<Channel>,
    pub image: v1alpha2::image_service_client::ImageServiceClient<Channel>,
}

impl CriClientV1alpha2 {
    pub async fn connect(path: &Path) -> Result<Self, ClientError> {
        let channel = connect_channel(path).await?;
        Ok(Self {
            runtime: v1alpha2::runtime_service_client::RuntimeServiceClient::new(channel.clone()),
            image: v1alpha2::image_service_client::ImageServiceClient::new(channel),
        })
    }
}

/// A CRI client over ttrpc. Calls name the service and method and carry prost messages.
#[derive(Clone)]
pub struct TtrpcCriClient {
    client: ttrpc::r#async::Client,
}

impl TtrpcCriClient {
    pub async fn connect(path: &Path) -> Result<Self, ClientError> {
        let client = ttrpc::r#async::Client::connect(&format!("unix://{}", path.display()))
            .await
            .map_err(|e| ClientError::Connect {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self { client })
    }

    /// Calls `service` (e.g. `runtime.v1.RuntimeService`) `method` with `req`, with a 30 s
    /// deadline.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
    ) -> Result<Resp, tonic::Status> {
        self.call_with_timeout(service, method, req, std::time::Duration::from_secs(30))
            .await
    }

    /// Calls `service` `method` with `req`; the server is told the deadline `timeout`.
    pub async fn call_with_timeout<Req: Message, Resp: Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
        timeout: std::time::Duration,
    ) -> Result<Resp, tonic::Status> {
        let request = ttrpc::Request {
            service: service.to_string(),
            method: method.to_string(),
            payload: req.encode_to_vec(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            ..Default::default()
        };
        match self.client.request(request).await {
            Ok(resp) => Resp::decode(resp.payload.as_slice())
                .map_err(|e| tonic::Status::internal(format!("malformed response: {e}"))),
            Err(e) => Err(status_of(e)),
        }
    }

    /// Calls the server-streaming `method` of `service` and collects its messages until the
    /// server ends the stream.
    pub async fn call_stream<Req: Message, Resp: Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
    ) -> Result<Vec<Resp>, tonic::Status> {
        let mut stream = self.open_stream(service, method, req).await?;
        let mut messages = Vec::new();
        while let Some(message) = Self::next_message(&mut stream).await? {
            messages.push(message);
        }
        Ok(messages)
    }

    /// Opens the server-streaming `method` of `service`; read it with [`Self::next_message`].
    pub async fn open_stream<Req: Message>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
    ) -> Result<ttrpc::r#async::StreamInner, tonic::Status> {
        let request = ttrpc::Request {
            service: service.to_string(),
            method: method.to_string(),
            payload: req.encode_to_vec(),
            ..Default::default()
        };
        self.client
            .new_stream(request, false, true)
            .await
            .map_err(status_of)
    }

    /// The next message of a server stream; `None` once the server has ended it.
    pub async fn next_message<Resp: Message + Default>(
        stream: &mut ttrpc::r#async::StreamInner,
    ) -> Result<Option<Resp>, tonic::Status> {
        match stream.recv().await {
            Ok(payload) => Resp::decode(payload.as_slice())
                .map(Some)
                .map_err(|e| tonic::Status::internal(format!("malformed message: {e}"))),
            Err(ttrpc::Error::Eof | ttrpc::Error::RemoteClosed) => Ok(None),
            Err(e) => Err(status_of(e)),
        }
    }

    /// `Version` over ttrpc on `runtime.<api>.RuntimeService`.
    pub async fn version(&self, api: &str) -> Result<v1::VersionResponse, tonic::Status> {
        self.call(
            &format!("runtime.{api}.RuntimeService"),
            "Version",
            &v1::VersionRequest::default(),
        )
        .await
    }
}

/// A ttrpc error as the gRPC status it carries (transport failures are `UNAVAILABLE`).
fn status_of(error: ttrpc::Error) -> tonic::Status {
    match error {
        ttrpc::Error::RpcStatus(status) => {
            tonic::Status::new(tonic::Code::from_i32(status.code.value()), status.message)
        }
        // The client's own deadline passed first, as gRPC clients report it.
        ttrpc::Error::Others(message) if message == "Request deadline elapsed" => {
            tonic::Status::deadline_exceeded(message)
        }
        e => tonic::Status::unavailable(e.to_string()),
    }
}
