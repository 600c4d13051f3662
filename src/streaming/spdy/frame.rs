//! SPDY/3 frames and their wire encoding, as a `tokio_util` codec.
//!
//! Control frames: `1 | version(15) | type(16) | flags(8) | length(24) | payload`.
//! Data frames: `0 | stream id(31) | flags(8) | length(24) | data`.
//! Name/value header blocks are zlib-compressed with the SPDY/3 dictionary, one zlib
//! stream per direction for the whole connection, so one codec value must encode (or
//! decode) every frame of its direction in order.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio_util::codec::{Decoder, Encoder};

use super::dictionary::header_dictionary;

pub const VERSION: u16 = 3;
/// The last frame of a stream in this direction.
pub const FLAG_FIN: u8 = 0x01;

/// `RST_STREAM` status codes used here.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_INVALID_STREAM: u32 = 2;
pub const RST_REFUSED_STREAM: u32 = 3;
pub const RST_CANCEL: u32 = 5;
pub const RST_INTERNAL_ERROR: u32 = 6;

/// Frames are at most this large (the length field has 24 bits).
const MAX_LENGTH: usize = (1 << 24) - 1;
/// The longest frame crius accepts: kubectl's data frames are 32 KiB, header blocks are
/// bounded below that; a peer announcing more is refused before anything is buffered.
const MAX_INCOMING_FRAME: usize = 1 << 20;
/// A decompressed header block may not grow beyond this.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Most name/value pairs of one header block, and most bytes of their names and values:
/// a stream keeps its headers while it lives (kubectl sends two or three short ones).
const MAX_HEADERS: usize = 64;
const MAX_HEADER_BYTES: usize = 8 * 1024;
const HEADER_SIZE: usize = 8;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Name/value pairs of a header block. Names are lower case on the wire.
pub type Headers = Vec<(String, String)>;

/// Looks up a header by name.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        /// (flags, id, value)
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type SPDY/3 says to ignore.
    Unknown {
        frame_type: u16,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("SPDY protocol error: {0}")]
    Protocol(String),
    #[error("SPDY header compression: {0}")]
    Compression(String),
}

fn protocol(message: impl Into<String>) -> FrameError {
    FrameError::Protocol(message.into())
}

/// Encodes and decodes SPDY/3 frames for one direction of one connection.
pub struct SpdyCodec {
    compressor: Option<Compress>,
    decompressor: Option<Decompress>,
}

impl Default for SpdyCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl SpdyCodec {
    pub fn new() -> Self {
        Self {
            compressor: None,
            decompressor: None,
        }
    }

    fn compress_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        let plain = encode_header_block(headers)?;
        let compressor = match &mut self.compressor {
            Some(c) => c,
            None => {
                let mut c = Compress::new(Compression::default(), true);
                c.set_dictionary(header_dictionary())
                    .map_err(|e| FrameError::Compression(e.to_string()))?;
                self.compressor.insert(c)
            }
        };
        let mut out = Vec::with_capacity(plain.len() + 64);
        let start_in = compressor.total_in();
        loop {
            let consumed = (compressor.total_in() - start_in) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            compressor
                .compress_vec(&plain[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::Compression(e.to_string()))?;
            let consumed = (compressor.total_in() - start_in) as usize;
            // A sync flush is complete when all input is in and there was room to spare.
            if consumed == plain.len() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }

    fn decompress_headers(&mut self, compressed: &[u8]) -> Result<Headers, FrameError> {
        let decompressor = self
            .decompressor
            .get_or_insert_with(|| Decompress::new(true));
        let mut out: Vec<u8> = Vec::with_capacity(compressed.len() * 4 + 64);
        let start_in = decompressor.total_in();
        loop {
            let consumed = (decompressor.total_in() - start_in) as usize;
            if out.capacity() - out.len() < 256 {
                out.reserve(1024);
            }
            match decompressor.decompress_vec(
                &compressed[consumed..],
                &mut out,
                FlushDecompress::Sync,
            ) {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    decompressor
                        .set_dictionary(header_dictionary())
                        .map_err(|e| FrameError::Compression(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(FrameError::Compression(e.to_string())),
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(protocol("header block too large"));
            }
            let consumed = (decompressor.total_in() - start_in) as usize;
            if consumed == compressed.len() && out.len() < out.capacity() {
                break;
            }
        }
        decode_header_block(&out)
    }
}

/// The uncompressed name/value block: a count, then length-prefixed names and values.
pub fn encode_header_block(headers: &Headers) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    let count = u32::try_from(headers.len()).map_err(|_| protocol("too many headers"))?;
    out.put_u32(count);
    for (name, value) in headers {
        for part in [name.to_ascii_lowercase().as_str(), value.as_str()] {
            let len = u32::try_from(part.len()).map_err(|_| protocol("header too long"))?;
            out.put_u32(len);
            out.put_slice(part.as_bytes());
        }
    }
    Ok(out)
}

pub fn decode_header_block(mut block: &[u8]) -> Result<Headers, FrameError> {
    let truncated = || protocol("truncated header block");
    if block.remaining() < 4 {
        return Err(truncated());
    }
    let count = block.get_u32() as usize;
    if count > MAX_HEADERS {
        return Err(protocol(format!(
            "{count} headers in one block, more than {MAX_HEADERS}"
        )));
    }
    let mut headers = Vec::with_capacity(count);
    let mut bytes = 0;
    for _ in 0..count {
        let mut pair = [String::new(), String::new()];
        for part in &mut pair {
            if block.remaining() < 4 {
                return Err(truncated());
            }
            let len = block.get_u32() as usize;
            if block.remaining() < len {
                return Err(truncated());
            }
            bytes += len;
            if bytes > MAX_HEADER_BYTES {
                return Err(protocol(format!(
                    "headers of more than {MAX_HEADER_BYTES} bytes in one block"
                )));
            }
            *part = String::from_utf8(block[..len].to_vec())
                .map_err(|_| protocol("header is not UTF-8"))?;
            block.advance(len);
        }
        let [name, value] = pair;
        headers.push((name, value));
    }
    Ok(headers)
}

fn stream_id(value: u32) -> u32 {
    value & 0x7fff_ffff
}

fn need(payload: &[u8], len: usize, what: &str) -> Result<(), FrameError> {
    if payload.len() < len {
        return Err(protocol(format!("{what} frame too short")));
    }
    Ok(())
}

impl Decoder for SpdyCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < HEADER_SIZE {
            return Ok(None);
        }
        let length = (u32::from_be_bytes([0, src[5], src[6], src[7]])) as usize;
        if length > MAX_INCOMING_FRAME {
            return Err(protocol(format!(
                "a frame of {length} bytes is more than the {MAX_INCOMING_FRAME} accepted"
            )));
        }
        if src.len() < HEADER_SIZE + length {
            src.reserve(HEADER_SIZE + length - src.len());
            return Ok(None);
        }
        let head = src.split_to(HEADER_SIZE);
        let payload = src.split_to(length);
        let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream_id: stream_id(first),
                flags,
                data: payload.freeze(),
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(protocol(format!("unsupported SPDY version {version}")));
        }
        let frame_type = (first & 0xffff) as u16;
        self.decode_control(frame_type, flags, payload).map(Some)
    }
}

impl SpdyCodec {
    /// A control frame's payload, by its type.
    fn decode_control(
        &mut self,
        frame_type: u16,
        flags: u8,
        mut payload: BytesMut,
    ) -> Result<Frame, FrameError> {
        let frame = match frame_type {
            TYPE_SYN_STREAM => {
                need(&payload, 10, "SYN_STREAM")?;
                let id = stream_id(payload.get_u32());
                let associated_to = stream_id(payload.get_u32());
                let priority = payload.get_u8() >> 5;
                let _slot = payload.get_u8();
                Frame::SynStream {
                    stream_id: id,
                    associated_to,
                    priority,
                    flags,
                    headers: self.decompress_headers(&payload)?,
                }
            }
            TYPE_SYN_REPLY => {
                need(&payload, 4, "SYN_REPLY")?;
                let id = stream_id(payload.get_u32());
                Frame::SynReply {
                    stream_id: id,
                    flags,
                    headers: self.decompress_headers(&payload)?,
                }
            }
            TYPE_HEADERS => {
                need(&payload, 4, "HEADERS")?;
                let id = stream_id(payload.get_u32());
                Frame::Headers {
                    stream_id: id,
                    flags,
                    headers: self.decompress_headers(&payload)?,
                }
            }
            TYPE_RST_STREAM => {
                need(&payload, 8, "RST_STREAM")?;
                Frame::RstStream {
                    stream_id: stream_id(payload.get_u32()),
                    status: payload.get_u32(),
                }
            }
            TYPE_SETTINGS => decode_settings(flags, payload)?,
            TYPE_PING => {
                need(&payload, 4, "PING")?;
                Frame::Ping {
                    id: payload.get_u32(),
                }
            }
            TYPE_GOAWAY => decode_goaway(payload)?,
            TYPE_WINDOW_UPDATE => {
                need(&payload, 8, "WINDOW_UPDATE")?;
                Frame::WindowUpdate {
                    stream_id: stream_id(payload.get_u32()),
                    delta: payload.get_u32() & 0x7fff_ffff,
                }
            }
            other => Frame::Unknown { frame_type: other },
        };
        Ok(frame)
    }
}

fn decode_settings(flags: u8, mut payload: BytesMut) -> Result<Frame, FrameError> {
    need(&payload, 4, "SETTINGS")?;
    let count = payload.get_u32() as usize;
    if payload.remaining() / 8 < count {
        return Err(protocol("SETTINGS frame too short"));
    }
    let entries = (0..count)
        .map(|_| {
            let word = payload.get_u32();
            ((word >> 24) as u8, word & 0x00ff_ffff, payload.get_u32())
        })
        .collect();
    Ok(Frame::Settings { flags, entries })
}

fn decode_goaway(mut payload: BytesMut) -> Result<Frame, FrameError> {
    need(&payload, 4, "GOAWAY")?;
    let last_good_stream_id = stream_id(payload.get_u32());
    // SPDY/3 added the status; be lenient with peers that leave it out.
    let status = if payload.remaining() >= 4 {
        payload.get_u32()
    } else {
        0
    };
    Ok(Frame::GoAway {
        last_good_stream_id,
        status,
    })
}

impl SpdyCodec {
    /// A SYN_REPLY or HEADERS frame: the stream id, then the compressed header block.
    fn put_headers_frame(
        &mut self,
        dst: &mut BytesMut,
        frame_type: u16,
        flags: u8,
        stream_id: u32,
        headers: &Headers,
    ) -> Result<(), FrameError> {
        let block = self.compress_headers(headers)?;
        put_control_header(dst, frame_type, flags, 4 + block.len());
        dst.put_u32(stream_id & 0x7fff_ffff);
        dst.put_slice(&block);
        Ok(())
    }
}

fn put_control_header(dst: &mut BytesMut, frame_type: u16, flags: u8, length: usize) {
    dst.put_u16(0x8000 | VERSION);
    dst.put_u16(frame_type);
    dst.put_u8(flags);
    dst.put_uint(length as u64, 3);
}

impl Encoder<Frame> for SpdyCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if data.len() > MAX_LENGTH {
                    return Err(protocol("data frame too large"));
                }
                dst.reserve(HEADER_SIZE + data.len());
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u8(flags);
                dst.put_uint(data.len() as u64, 3);
                dst.put_slice(&data);
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                let block = self.compress_headers(&headers)?;
                put_control_header(dst, TYPE_SYN_STREAM, flags, 10 + block.len());
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(associated_to & 0x7fff_ffff);
                dst.put_u8((priority & 0x07) << 5);
                dst.put_u8(0);
                dst.put_slice(&block);
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => self.put_headers_frame(dst, TYPE_SYN_REPLY, flags, stream_id, &headers)?,
            Frame::Headers {
                stream_id,
                flags,
                headers,
            } => self.put_headers_frame(dst, TYPE_HEADERS, flags, stream_id, &headers)?,
            Frame::RstStream { stream_id, status } => {
                put_control_header(dst, TYPE_RST_STREAM, 0, 8);
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(status);
            }
            Frame::Settings { flags, entries } => {
                put_control_header(dst, TYPE_SETTINGS, flags, 4 + 8 * entries.len());
                dst.put_u32(entries.len() as u32);
                for (entry_flags, id, value) in entries {
                    dst.put_u32(((entry_flags as u32) << 24) | (id & 0x00ff_ffff));
                    dst.put_u32(value);
                }
            }
            Frame::Ping { id } => {
                put_control_header(dst, TYPE_PING, 0, 4);
                dst.put_u32(id);
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                put_control_header(dst, TYPE_GOAWAY, 0, 8);
                dst.put_u32(last_good_stream_id & 0x7fff_ffff);
                dst.put_u32(status);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                put_control_header(dst, TYPE_WINDOW_UPDATE, 0, 8);
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(delta & 0x7fff_ffff);
            }
            Frame::Unknown { frame_type } => {
                return Err(protocol(format!(
                    "cannot send a frame of unknown type {frame_type}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_announcing_more_than_a_mebibyte_is_refused_before_buffering() {
        let mut codec = SpdyCodec::new();
        // A data frame header announcing 16 MiB - 1.
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0, 0xff, 0xff, 0xff][..]);
        assert!(codec.decode(&mut buf).is_err());
        assert!(buf.capacity() < 1 << 20, "nothing was reserved for it");
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// Encodes frames with one codec and decodes them with another, as the two ends of a
    /// connection direction would.
    fn round_trip(frames: Vec<Frame>) -> Vec<Frame> {
        let mut sender = SpdyCodec::new();
        let mut receiver = SpdyCodec::new();
        let mut wire = BytesMut::new();
        for frame in frames {
            sender.encode(frame, &mut wire).unwrap();
        }
        let mut decoded = Vec::new();
        while let Some(frame) = receiver.decode(&mut wire).unwrap() {
            decoded.push(frame);
        }
        assert!(wire.is_empty(), "{} bytes left over", wire.len());
        decoded
    }

    #[test]
    fn every_frame_type_round_trips_in_order() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 2,
                flags: FLAG_FIN,
                headers: headers(&[("streamtype", "stdout"), ("port", "80")]),
            },
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: Vec::new(),
            },
            Frame::Headers {
                stream_id: 3,
                flags: 0,
                headers: headers(&[("x", "y")]),
            },
            Frame::Data {
                stream_id: 3,
                flags: 0,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::new(),
            },
            Frame::RstStream {
                stream_id: 1,
                status: RST_CANCEL,
            },
            Frame::Settings {
                flags: 0,
                entries: vec![(1, 7, 65536)],
            },
            Frame::Ping { id: 42 },
            Frame::WindowUpdate {
                stream_id: 3,
                delta: 1000,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
        ];
        assert_eq!(round_trip(frames.clone()), frames);
    }

    #[test]
    fn partial_input_waits_for_the_rest_of_the_frame() {
        let mut sender = SpdyCodec::new();
        let mut wire = BytesMut::new();
        sender.encode(Frame::Ping { id: 7 }, &mut wire).unwrap();
        let mut receiver = SpdyCodec::new();
        let mut partial = wire.split_to(5);
        assert_eq!(receiver.decode(&mut partial).unwrap(), None);
        partial.unsplit(wire);
        assert_eq!(
            receiver.decode(&mut partial).unwrap(),
            Some(Frame::Ping { id: 7 })
        );
    }

    #[test]
    fn the_wire_layout_matches_the_spec() {
        let mut wire = BytesMut::new();
        SpdyCodec::new()
            .encode(
                Frame::RstStream {
                    stream_id: 5,
                    status: RST_CANCEL,
                },
                &mut wire,
            )
            .unwrap();
        assert_eq!(
            &wire[..],
            &[0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 0, 5]
        );
        let mut wire = BytesMut::new();
        SpdyCodec::new()
            .encode(
                Frame::Data {
                    stream_id: 0x0102_0304,
                    flags: FLAG_FIN,
                    data: Bytes::from_static(b"ab"),
                },
                &mut wire,
            )
            .unwrap();
        assert_eq!(&wire[..], &[1, 2, 3, 4, 1, 0, 0, 2, b'a', b'b']);
    }

    #[test]
    fn unknown_control_frames_are_skipped_and_other_versions_refused() {
        let mut wire = BytesMut::from(&[0x80, 3, 0, 0x20, 0, 0, 0, 2, 9, 9][..]);
        assert_eq!(
            SpdyCodec::new().decode(&mut wire).unwrap(),
            Some(Frame::Unknown { frame_type: 0x20 })
        );
        let mut wire = BytesMut::from(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert!(matches!(
            SpdyCodec::new().decode(&mut wire),
            Err(FrameError::Protocol(_))
        ));
    }

    #[test]
    fn truncated_and_oversized_header_blocks_are_errors() {
        assert!(decode_header_block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        let mut block = encode_header_block(&headers(&[("a", "b")])).unwrap();
        block.truncate(block.len() - 1);
        assert!(decode_header_block(&block).is_err());
        // A huge count with no pairs behind it must not allocate for the count.
        assert!(decode_header_block(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn a_stream_keeps_few_and_short_headers() {
        let empty: Vec<(String, String)> = (0..=MAX_HEADERS)
            .map(|_| (String::new(), String::new()))
            .collect();
        let many = encode_header_block(&empty).unwrap();
        assert!(
            decode_header_block(&many).is_err(),
            "thousands of empty pairs"
        );
        let long = "v".repeat(MAX_HEADER_BYTES);
        let block = encode_header_block(&headers(&[("streamtype", &long)])).unwrap();
        assert!(decode_header_block(&block).is_err(), "a long value");
        let ok = encode_header_block(&headers(&[("streamtype", "data"), ("port", "80")])).unwrap();
        assert_eq!(decode_header_block(&ok).unwrap().len(), 2);
    }

    /// A SYN_STREAM header block as another implementation (zlib via Python, level 9, the
    /// SPDY/3 dictionary, sync flush) compressed it: headers `streamtype: stdout`,
    /// `port: 8080`, `requestid: 0`.
    const FOREIGN_BLOCK: &[u8] = include_bytes!("testdata/foreign_header_block.bin");

    #[test]
    fn decodes_a_header_block_compressed_by_another_implementation() {
        let mut codec = SpdyCodec::new();
        let decoded = codec.decompress_headers(FOREIGN_BLOCK).unwrap();
        assert_eq!(
            decoded,
            headers(&[
                ("streamtype", "stdout"),
                ("port", "8080"),
                ("requestid", "0")
            ])
        );
    }

    #[test]
    fn the_compression_context_carries_across_frames() {
        let mut sender = SpdyCodec::new();
        let first = sender
            .compress_headers(&headers(&[("streamtype", "stdout")]))
            .unwrap();
        let second = sender
            .compress_headers(&headers(&[("streamtype", "stdout")]))
            .unwrap();
        // The second block refers back to the first: it is shorter and only decodes after it.
        assert!(second.len() < first.len());
        let mut receiver = SpdyCodec::new();
        assert!(receiver.decompress_headers(&second).is_err());
        let mut receiver = SpdyCodec::new();
        receiver.decompress_headers(&first).unwrap();
        assert_eq!(
            receiver.decompress_headers(&second).unwrap(),
            headers(&[("streamtype", "stdout")])
        );
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn frames_of_any_bytes_decode_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut codec = SpdyCodec::new();
            let mut buf = BytesMut::from(&data[..]);
            // Every frame out of the bytes, until they run out or one is refused.
            for _ in 0..64 {
                match codec.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        #[test]
        fn header_blocks_of_any_bytes_decode_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_header_block(&data);
        }

        #[test]
        fn header_blocks_round_trip(headers in proptest::collection::btree_map("[a-z-]{1,16}", "[ -~]{0,32}", 0..8)) {
            let headers: Headers = headers.into_iter().collect();
            let block = encode_header_block(&headers).unwrap();
            let decoded = decode_header_block(&block).unwrap();
            prop_assert_eq!(decoded, headers);
        }
    }
}
