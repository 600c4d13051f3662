//! What the generated ttrpc servers (`build/ttrpc.rs`) call: decode a payload into the tonic
//! request the shared trait implementation takes, encode its answer, and map a `Status` to
//! ttrpc's. The client's `timeout_nano` travels as the `grpc-timeout` header, so the one
//! deadline path serves both transports.

use futures::{Stream, StreamExt};
use prost::Message;
use tonic::Status;

/// The tonic request for a ttrpc payload, or the error response for a malformed one.
pub fn decode<Req: Message + Default>(
    rpc: &str,
    payload: &[u8],
    timeout_nano: i64,
) -> Result<tonic::Request<Req>, ttrpc::Response> {
    let message = Req::decode(payload).map_err(|e| {
        status_response(&Status::invalid_argument(format!(
            "malformed {rpc} request: {e}"
        )))
    })?;
    let mut request = tonic::Request::new(message);
    if let Some(header) = crate::cri::deadline::grpc_timeout_header(timeout_nano)
        && let Ok(value) = header.parse()
    {
        request.metadata_mut().insert("grpc-timeout", value);
    }
    Ok(request)
}

/// The ttrpc response for a unary call's outcome.
pub fn respond<Resp: Message>(outcome: Result<tonic::Response<Resp>, Status>) -> ttrpc::Response {
    match outcome {
        Ok(response) => {
            let mut resp = ttrpc::Response::new();
            resp.payload = response.into_inner().encode_to_vec();
            resp
        }
        Err(status) => status_response(&status),
    }
}

/// Sends a server stream's messages in order; an error ends it with that status.
pub async fn send_stream<S, Resp>(
    inner: ttrpc::r#async::StreamInner,
    opened: Result<tonic::Response<S>, Status>,
) -> ttrpc::Result<Option<ttrpc::Response>>
where
    S: Stream<Item = Result<Resp, Status>> + Send,
    Resp: Message,
{
    let stream = match opened {
        Ok(stream) => stream.into_inner(),
        Err(status) => return Ok(Some(status_response(&status))),
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(message) => {
                if inner.send(message.encode_to_vec()).await.is_err() {
                    // The client went away: nothing more to send it.
                    return Ok(None);
                }
            }
            Err(status) => return Ok(Some(status_response(&status))),
        }
    }
    Ok(None)
}

/// A ttrpc response that carries `status` with its gRPC code.
pub fn status_response(status: &Status) -> ttrpc::Response {
    let code = <ttrpc::Code as protobuf::Enum>::from_i32(status.code() as i32)
        .unwrap_or(ttrpc::Code::UNKNOWN);
    let mut resp = ttrpc::Response::new();
    resp.status = protobuf::MessageField::some(ttrpc::get_status(code, status.message()));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1;

    #[test]
    fn a_payload_becomes_a_request_with_the_clients_deadline() {
        let payload = v1::ContainerStatusRequest {
            container_id: "abc".into(),
            verbose: true,
        }
        .encode_to_vec();
        let request =
            decode::<v1::ContainerStatusRequest>("ContainerStatus", &payload, 2_000_000_000)
                .unwrap();
        assert_eq!(request.get_ref().container_id, "abc");
        let timeout = request.metadata().get("grpc-timeout").unwrap();
        assert_eq!(timeout.to_str().unwrap(), "2000000u");
        let none = decode::<v1::ContainerStatusRequest>("ContainerStatus", &payload, 0).unwrap();
        assert!(none.metadata().get("grpc-timeout").is_none());
    }

    #[test]
    fn a_malformed_payload_is_invalid_argument() {
        let resp =
            decode::<v1::ContainerStatusRequest>("ContainerStatus", &[0xff, 0xff], 0).unwrap_err();
        let status = resp.status.into_option().unwrap();
        assert_eq!(status.code.value(), tonic::Code::InvalidArgument as i32);
        assert!(status.message.contains("malformed ContainerStatus request"));
    }

    #[test]
    fn an_error_keeps_its_code() {
        let resp = respond::<v1::VersionResponse>(Err(Status::not_found("gone")));
        let status = resp.status.into_option().unwrap();
        assert_eq!(status.code.value(), tonic::Code::NotFound as i32);
        assert_eq!(status.message, "gone");
        assert!(resp.payload.is_empty());
    }
}
