//! Repairs the HTTP/2 `:authority` of gRPC clients that dial a unix socket by path.
//!
//! grpc-go clients of kubelet and crictl up to 1.26 send the socket path (say
//! `/run/crius/crius.sock`) as `:authority`. That is not a valid authority, and the HTTP/2
//! server under tonic resets every such request with `PROTOCOL_ERROR`; containerd's Go
//! server accepts it. So the gRPC socket reads through this wrapper: the first request
//! header block of a connection decides. With a valid (or no) authority the connection
//! passes through untouched. Otherwise every header block the client sends is decoded and
//! sent on re-encoded without compression state, with `:authority: localhost`.
//! Only the client-to-server direction is touched; no crate offers this, and the rewrite
//! needs only an HPACK decoder ([`super::hpack`]) and literal re-encoding.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::{Decoder, encode_integer};

/// "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The HTTP/2 default, which the server does not raise.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// A header block may not grow beyond this while it is collected (the server takes header
/// lists of 16 KiB).
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The HPACK dynamic table size HTTP/2 servers start with and this one never raises: a
/// client that asks for a larger table is refused.
const MAX_HPACK_TABLE: usize = 4096;
/// The most a decoded header list may hold, counted as RFC 7541 counts a table entry (name,
/// value and 32 bytes each): a small block of references to one large entry can otherwise
/// decode to gigabytes.
const MAX_HEADER_LIST: usize = 64 * 1024;
/// Rewritten bytes not yet read by the server at most: the rest of the input waits, so a
/// read of small blocks that each decode to the limit cannot pile up megabytes.
const MAX_PENDING_OUTPUT: usize = 64 * 1024;
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
const READ_CHUNK: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No request header block seen yet.
    Undecided,
    Passthrough,
    Rewrite,
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct PendingBlock {
    stream_id: u32,
    /// END_STREAM of the HEADERS frame.
    end_stream: bool,
    /// The PRIORITY fields of the HEADERS frame, when present.
    priority: Option<[u8; 5]>,
    fragment: BytesMut,
    /// The frames as received, for passing them through unchanged.
    raw: BytesMut,
}

/// The client-to-server byte transformation, independent of I/O.
struct Rewriter {
    mode: Mode,
    preface_left: usize,
    /// Payload bytes of the current non-header frame still to pass on as they are.
    payload_left: usize,
    block: Option<PendingBlock>,
    decoder: Decoder,
    /// Bytes received and not processed yet.
    input: BytesMut,
    /// Bytes ready for the server.
    output: BytesMut,
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl Rewriter {
    fn new() -> Self {
        Self {
            mode: Mode::Undecided,
            preface_left: PREFACE_LEN,
            payload_left: 0,
            block: None,
            decoder: Decoder::new(MAX_HPACK_TABLE),
            input: BytesMut::new(),
            output: BytesMut::new(),
        }
    }

    /// Moves every complete piece of `input` to `output`, rewriting header blocks.
    fn process(&mut self) -> io::Result<()> {
        loop {
            if self.output.len() >= MAX_PENDING_OUTPUT {
                return Ok(());
            }
            if self.preface_left > 0 || self.payload_left > 0 || self.mode == Mode::Passthrough {
                let limit = if self.mode == Mode::Passthrough {
                    self.input.len()
                } else {
                    self.preface_left.max(self.payload_left)
                };
                let n = limit.min(self.input.len());
                if n == 0 {
                    return Ok(());
                }
                self.output.extend_from_slice(&self.input.split_to(n));
                if self.preface_left > 0 {
                    self.preface_left -= n;
                } else if self.payload_left > 0 {
                    self.payload_left -= n;
                }
                continue;
            }
            if self.input.len() < FRAME_HEADER_LEN {
                return Ok(());
            }
            let length =
                u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            let frame_type = self.input[3];
            if frame_type != TYPE_HEADERS && frame_type != TYPE_CONTINUATION {
                if self.block.is_some() {
                    return Err(invalid("a header block was interrupted by another frame"));
                }
                self.output
                    .extend_from_slice(&self.input.split_to(FRAME_HEADER_LEN));
                self.payload_left = length;
                continue;
            }
            // The server allows no larger frame: refused before its bytes are waited for.
            if length > MAX_FRAME_PAYLOAD {
                return Err(invalid("a header frame larger than the maximum frame size"));
            }
            if self.input.len() < FRAME_HEADER_LEN + length {
                return Ok(());
            }
            let frame = self.input.split_to(FRAME_HEADER_LEN + length);
            self.collect_header_frame(frame)?;
        }
    }

    fn collect_header_frame(&mut self, mut frame: BytesMut) -> io::Result<()> {
        let raw = frame.clone();
        let frame_type = frame[3];
        let flags = frame[4];
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        frame.advance(FRAME_HEADER_LEN);
        if frame_type == TYPE_HEADERS {
            if self.block.is_some() {
                return Err(invalid("HEADERS inside another header block"));
            }
            let mut payload = frame;
            let padding = if flags & FLAG_PADDED != 0 {
                if payload.is_empty() {
                    return Err(invalid("padded HEADERS without a pad length"));
                }
                let pad = payload[0] as usize;
                payload.advance(1);
                pad
            } else {
                0
            };
            let priority = if flags & FLAG_PRIORITY != 0 {
                if payload.len() < 5 {
                    return Err(invalid("HEADERS too short for its priority"));
                }
                let mut fields = [0u8; 5];
                fields.copy_from_slice(&payload[..5]);
                payload.advance(5);
                Some(fields)
            } else {
                None
            };
            if payload.len() < padding {
                return Err(invalid("HEADERS padding longer than the frame"));
            }
            payload.truncate(payload.len() - padding);
            self.block = Some(PendingBlock {
                stream_id,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment: payload,
                raw,
            });
        } else {
            let Some(block) = self.block.as_mut() else {
                return Err(invalid("CONTINUATION without a header block"));
            };
            if block.stream_id != stream_id {
                return Err(invalid("CONTINUATION for another stream"));
            }
            block.fragment.extend_from_slice(&frame);
            block.raw.extend_from_slice(&raw);
            if block.fragment.len() > MAX_HEADER_BLOCK {
                return Err(invalid("header block too large"));
            }
        }
        if flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.finish_block(block)?;
        }
        Ok(())
    }

    fn finish_block(&mut self, block: PendingBlock) -> io::Result<()> {
        let mut headers = decode_bounded(&mut self.decoder, &block.fragment)?;
        let authority = headers.iter_mut().find(|(name, _)| name == b":authority");
        let needs_repair = authority
            .as_ref()
            .is_some_and(|(_, value)| http::uri::Authority::try_from(value.as_slice()).is_err());
        if self.mode == Mode::Undecided {
            self.mode = if needs_repair {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(authority.as_ref().map(|(_, v)| v.as_slice()).unwrap_or_default()),
                    "gRPC client sent an invalid :authority; rewriting its headers"
                );
                Mode::Rewrite
            } else {
                Mode::Passthrough
            };
        }
        if self.mode == Mode::Passthrough {
            self.output.extend_from_slice(&block.raw);
            return Ok(());
        }
        if let Some((_, value)) = authority
            && needs_repair
        {
            *value = REPLACEMENT_AUTHORITY.to_vec();
        }
        let encoded = encode_literal(&headers);
        self.write_header_frames(&block, &encoded);
        Ok(())
    }

    /// Writes `encoded` as a HEADERS frame and as many CONTINUATION frames as it needs.
    fn write_header_frames(&mut self, block: &PendingBlock, encoded: &[u8]) {
        let priority_len = if block.priority.is_some() { 5 } else { 0 };
        let first_len = encoded.len().min(MAX_FRAME_PAYLOAD - priority_len);
        let (first, mut rest) = encoded.split_at(first_len);
        let mut flags = 0;
        if block.end_stream {
            flags |= FLAG_END_STREAM;
        }
        if block.priority.is_some() {
            flags |= FLAG_PRIORITY;
        }
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        self.put_frame_header(
            priority_len + first.len(),
            TYPE_HEADERS,
            flags,
            block.stream_id,
        );
        if let Some(priority) = block.priority {
            self.output.put_slice(&priority);
        }
        self.output.put_slice(first);
        while !rest.is_empty() {
            let (chunk, remaining) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
            rest = remaining;
            let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
            self.put_frame_header(chunk.len(), TYPE_CONTINUATION, flags, block.stream_id);
            self.output.put_slice(chunk);
        }
    }

    fn put_frame_header(&mut self, length: usize, frame_type: u8, flags: u8, stream_id: u32) {
        self.output.put_uint(length as u64, 3);
        self.output.put_u8(frame_type);
        self.output.put_u8(flags);
        self.output.put_u32(stream_id);
    }
}

/// Decodes a header block into at most [`MAX_HEADER_LIST`] bytes of headers.
fn decode_bounded(decoder: &mut Decoder, block: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut headers = Vec::new();
    let mut size = 0usize;
    decoder
        .decode(block, |name, value| {
            size = size.saturating_add(name.len() + value.len() + 32);
            if size <= MAX_HEADER_LIST {
                headers.push((name.to_vec(), value.to_vec()));
            }
        })
        .map_err(|e| invalid(format!("undecodable header block: {e}")))?;
    if size > MAX_HEADER_LIST {
        return Err(invalid(format!(
            "the header list decodes to more than {MAX_HEADER_LIST} bytes"
        )));
    }
    Ok(headers)
}

/// HPACK "literal header field without indexing, new name", no Huffman coding: touches no
/// dynamic table, so the server's decoder needs no state from earlier blocks.
fn encode_literal(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        for part in [name, value] {
            encode_integer(part.len(), 7, 0, &mut out);
            out.extend_from_slice(part);
        }
    }
    out
}

/// A server-side connection whose incoming HTTP/2 header blocks get a valid `:authority`.
pub struct AuthorityRepair<S> {
    inner: S,
    rewriter: Rewriter,
    eof: bool,
}

impl<S> AuthorityRepair<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRepair<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let output = &mut this.rewriter.output;
            if !output.is_empty() {
                let n = output.len().min(buf.remaining());
                buf.put_slice(&output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Decided and drained: read straight through.
            if this.rewriter.mode == Mode::Passthrough && this.rewriter.input.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            // What processing left of earlier reads goes before anything new is read.
            if !this.rewriter.input.is_empty() {
                this.rewriter.process()?;
                if !this.rewriter.output.is_empty() {
                    continue;
                }
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut chunk_buf = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk_buf))?;
            if chunk_buf.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.rewriter.input.extend_from_slice(chunk_buf.filled());
            this.rewriter.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRepair<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityRepair<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        out.push(frame_type);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn request_headers(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/runtime.v1.RuntimeService/Version"),
            (":authority", authority),
            ("content-type", "application/grpc"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    /// Runs `input` through a rewriter in small pieces; returns what the server would read.
    fn rewrite(input: &[u8]) -> Vec<u8> {
        let mut rewriter = Rewriter::new();
        for piece in input.chunks(7) {
            rewriter.input.extend_from_slice(piece);
            rewriter.process().unwrap();
        }
        rewriter.output.to_vec()
    }

    /// Splits the server's input into (type, flags, stream, payload) after the preface.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert!(bytes.starts_with(PREFACE));
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    fn client_bytes(authorities: &[&str]) -> Vec<u8> {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        for (i, authority) in authorities.iter().enumerate() {
            let headers = request_headers(authority);
            let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            let stream = 1 + 2 * i as u32;
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, &block));
            input.extend(frame(0x0, FLAG_END_STREAM, stream, b"\0\0\0\0\0"));
        }
        input
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_in_every_request() {
        let output = rewrite(&client_bytes(&[
            "/run/crius/crius.sock",
            "/run/crius/crius.sock",
        ]));
        let frames = frames(&output);
        assert_eq!(frames.len(), 5);
        let mut decoder = loona_hpack::Decoder::new();
        for (i, index) in [1, 3].into_iter().enumerate() {
            let (frame_type, flags, stream, payload) = &frames[index];
            assert_eq!(*frame_type, TYPE_HEADERS);
            assert_eq!(*flags, FLAG_END_HEADERS);
            assert_eq!(*stream, 1 + 2 * i as u32);
            assert_eq!(
                decoder.decode(payload).unwrap(),
                request_headers("localhost"),
                "request {i}"
            );
        }
        assert_eq!(frames[2].3, b"\0\0\0\0\0", "DATA passes unchanged");
    }

    #[test]
    fn a_valid_authority_passes_the_connection_through_unchanged() {
        let input = client_bytes(&["localhost", "/not/looked/at/any/more"]);
        assert_eq!(rewrite(&input), input);
    }

    #[test]
    fn continuation_frames_priority_and_padding_are_handled() {
        let mut encoder = loona_hpack::Encoder::new();
        let headers = request_headers("/x.sock");
        let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let (first, second) = block.split_at(10);
        let mut payload = vec![2u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(first);
        payload.extend_from_slice(&[0, 0]); // padding
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            1,
            &payload,
        ));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, second));
        let frames = frames(&rewrite(&input));
        assert_eq!(frames.len(), 1);
        let (_, flags, _, payload) = &frames[0];
        assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 16]);
        assert_eq!(
            loona_hpack::Decoder::new().decode(&payload[5..]).unwrap(),
            request_headers("localhost")
        );
    }

    #[test]
    fn a_huge_block_is_split_into_continuations() {
        let mut headers = request_headers("/x.sock");
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = loona_hpack::Encoder::new()
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut input = PREFACE.to_vec();
        for (i, chunk) in block.chunks(MAX_FRAME_PAYLOAD).enumerate() {
            let last = (i + 1) * MAX_FRAME_PAYLOAD >= block.len();
            let frame_type = if i == 0 {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            input.extend(frame(
                frame_type,
                if last { FLAG_END_HEADERS } else { 0 },
                1,
                chunk,
            ));
        }
        let frames = frames(&rewrite(&input));
        assert!(frames.len() >= 3);
        assert!(frames.iter().all(|f| f.3.len() <= MAX_FRAME_PAYLOAD));
        let block: Vec<u8> = frames.iter().flat_map(|f| f.3.clone()).collect();
        let decoded = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(decoded[3].1, b"localhost");
        assert_eq!(decoded[5].1.len(), 40_000);
    }

    #[test]
    fn a_broken_header_block_is_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff],
        ));
        let mut rewriter = Rewriter::new();
        rewriter.input.extend_from_slice(&input);
        assert!(rewriter.process().is_err());
    }

    #[test]
    fn a_header_frame_larger_than_the_server_allows_is_refused_before_its_bytes() {
        let mut input = PREFACE.to_vec();
        // Only the frame header of a 16 MiB HEADERS frame: refused without waiting for more.
        input.extend_from_slice(&[0xff, 0xff, 0xff, TYPE_HEADERS, FLAG_END_HEADERS, 0, 0, 0, 1]);
        let mut rewriter = Rewriter::new();
        rewriter.input.extend_from_slice(&input);
        assert!(rewriter.process().is_err());
    }

    /// One HEADERS frame (with CONTINUATIONs as needed) carrying `block` on stream 1.
    fn header_frames(block: &[u8]) -> Vec<u8> {
        let mut input = PREFACE.to_vec();
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME_PAYLOAD).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let frame_type = if i == 0 {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            let flags = if i + 1 == chunks.len() {
                FLAG_END_HEADERS
            } else {
                0
            };
            input.extend(frame(frame_type, flags, 1, chunk));
        }
        input
    }

    #[test]
    fn references_that_decode_to_a_huge_header_list_are_refused() {
        // A 4000-byte value indexed into the table, then referenced 16 Ki times: a 20 KiB
        // block that would decode to 64 MiB.
        let mut block = vec![0x40, 5];
        block.extend_from_slice(b"x-big");
        block.extend(loona_hpack::encoder::encode_integer(4000, 7));
        block.extend(std::iter::repeat_n(b'a', 4000));
        // The new entry is the first dynamic one: index 62.
        block.extend(std::iter::repeat_n(0x80 | 62, 16 * 1024));
        let mut rewriter = Rewriter::new();
        rewriter.input.extend_from_slice(&header_frames(&block));
        let err = rewriter.process().expect_err("a header list bomb");
        assert!(err.to_string().contains("decodes to more than"), "{err}");
    }

    #[test]
    fn a_larger_hpack_table_than_the_server_allows_is_refused() {
        let mut allowed = loona_hpack::encoder::encode_integer(MAX_HPACK_TABLE, 5);
        allowed[0] |= 0x20;
        let mut too_large = loona_hpack::encoder::encode_integer(MAX_HPACK_TABLE + 1, 5);
        too_large[0] |= 0x20;
        for (update, ok) in [(allowed, true), (too_large, false)] {
            let mut block = update;
            block.extend(
                loona_hpack::Encoder::new().encode(
                    request_headers("/x.sock")
                        .iter()
                        .map(|(n, v)| (n.as_slice(), v.as_slice())),
                ),
            );
            let mut rewriter = Rewriter::new();
            rewriter.input.extend_from_slice(&header_frames(&block));
            assert_eq!(rewriter.process().is_ok(), ok);
        }
    }

    #[tokio::test]
    async fn a_read_of_many_blocks_is_rewritten_a_bounded_piece_at_a_time() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let authorities = vec!["/run/crius.sock"; 3000];
        let input = client_bytes(&authorities);
        let mut rewriter = Rewriter::new();
        rewriter.input.extend_from_slice(&input);
        rewriter.process().unwrap();
        assert!(rewriter.output.len() < MAX_PENDING_OUTPUT + 1024);
        assert!(
            !rewriter.input.is_empty(),
            "all of it was rewritten at once"
        );
        let mut expected = rewriter.output.split().to_vec();
        loop {
            rewriter.process().unwrap();
            if rewriter.output.is_empty() {
                break;
            }
            expected.extend_from_slice(&rewriter.output.split());
        }
        assert!(rewriter.input.is_empty());

        let (mut client, server) = tokio::io::duplex(1 << 20);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
        });
        let mut read = Vec::new();
        AuthorityRepair::new(server)
            .read_to_end(&mut read)
            .await
            .unwrap();
        writer.await.unwrap();
        assert_eq!(read, expected);
    }

    #[tokio::test]
    async fn reads_through_the_wrapper_see_the_rewritten_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let input = client_bytes(&["/run/crius.sock"]);
        let expected = rewrite(&input);
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
        });
        let mut wrapped = AuthorityRepair::new(server);
        let mut read = Vec::new();
        wrapped.read_to_end(&mut read).await.unwrap();
        writer.await.unwrap();
        assert_eq!(read, expected);
    }
}
