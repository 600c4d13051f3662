//! A bounded HPACK decoder (RFC 7541) for [`super::authority`], which reads the request
//! headers of gRPC connections before the HTTP/2 server does.
//!
//! Written here rather than taken from a crate: the HPACK crates outside `h2` (whose own is
//! private) build a hash table of the Huffman code for every string they decode, which
//! cost every new connection some 40 µs; this decoder walks the canonical code with two
//! small arrays, and its dynamic table is bounded by the size the server allows.

use std::collections::VecDeque;

/// Why a header block cannot be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HpackError {
    #[error("the header block ends inside a field")]
    Truncated,
    #[error("an integer longer than HPACK allows")]
    IntegerOverflow,
    #[error("index {0} names no table entry")]
    BadIndex(usize),
    #[error("dynamic table size {0} over the {1} bytes allowed")]
    TableTooLarge(usize, usize),
    #[error("a dynamic table size update after the first field")]
    LateSizeUpdate,
    #[error("invalid Huffman code")]
    Huffman,
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The Huffman code of RFC 7541 Appendix B is canonical: it is fully given by how many
/// symbols have each code length (index: length in bits)...
const CODE_LENGTH_COUNTS: [u16; 31] = [
    0, 0, 0, 0, 0, 10, 26, 32, 6, 0, 5, 3, 2, 6, 2, 3, 0, 0, 0, 3, 8, 13, 26, 29, 12, 4, 15, 19,
    29, 0, 4,
];

/// ...and the symbols ordered by code length, then by value (256 is end-of-string).
const SYMBOLS_BY_CODE: [u16; 257] = [
    // 5 bits
    48, 49, 50, 97, 99, 101, 105, 111, 115, 116, //
    // 6 bits
    32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104, 108, 109,
    110, 112, 114, 117, //
    // 7 bits
    58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 89,
    106, 107, 113, 118, 119, 120, 121, 122, //
    // 8 bits
    38, 42, 44, 59, 88, 90, //
    // 10 bits
    33, 34, 40, 41, 63, //
    // 11 bits
    39, 43, 124, //
    // 12 bits
    35, 62, //
    // 13 bits
    0, 36, 64, 91, 93, 126, //
    // 14 bits
    94, 125, //
    // 15 bits
    60, 96, 123, //
    // 19 bits
    92, 195, 208, //
    // 20 bits
    128, 130, 131, 162, 184, 194, 224, 226, //
    // 21 bits
    153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230, //
    // 22 bits
    129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185, 186, 187,
    189, 190, 196, 198, 228, 232, 233, //
    // 23 bits
    1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166, 168,
    174, 175, 180, 182, 183, 188, 191, 197, 231, 239, //
    // 24 bits
    9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237, //
    // 25 bits
    199, 207, 234, 235, //
    // 26 bits
    192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255, //
    // 27 bits
    203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252, 253,
    254, //
    // 28 bits
    2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28, 29, 30, 31,
    127, 220, 249, //
    // 30 bits
    10, 13, 22, 256,
];

const END_OF_STRING: u16 = 256;
/// Bytes a table entry counts beyond its name and value (RFC 7541 section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Decodes the Huffman-coded `input` (RFC 7541 section 5.2): one bit at a time down the
/// canonical code, as zlib's `puff` decodes deflate.
pub fn huffman_decode(input: &[u8]) -> Result<Vec<u8>, HpackError> {
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let (mut code, mut len, mut first, mut offset) = (0u32, 0usize, 0u32, 0usize);
    for byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let count = u32::from(*CODE_LENGTH_COUNTS.get(len).ok_or(HpackError::Huffman)?);
            if code - first < count {
                let symbol = SYMBOLS_BY_CODE[offset + (code - first) as usize];
                if symbol == END_OF_STRING {
                    return Err(HpackError::Huffman);
                }
                out.push(symbol as u8);
                (code, len, first, offset) = (0, 0, 0, 0);
            } else {
                offset += count as usize;
                first = (first + count) << 1;
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, all ones (the start of end-of-string).
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(out)
}

/// An HPACK integer with an `prefix`-bit prefix (RFC 7541 section 5.1), for the encoder
/// side of the rewrite.
pub fn encode_integer(value: usize, prefix: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A header block being read.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn integer(&mut self, prefix: u8) -> Result<usize, HpackError> {
        let max = (1usize << prefix) - 1;
        let first = self.peek().ok_or(HpackError::Truncated)?;
        self.at += 1;
        let mut value = usize::from(first) & max;
        if value < max {
            return Ok(value);
        }
        // Four continuation bytes reach 2^28, far beyond any length or index allowed here.
        for shift in (0..=21).step_by(7) {
            let byte = self.peek().ok_or(HpackError::Truncated)?;
            self.at += 1;
            value += usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HpackError::IntegerOverflow)
    }

    fn string(&mut self) -> Result<Vec<u8>, HpackError> {
        let huffman = self.peek().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let len = self.integer(7)?;
        let end = self.at.checked_add(len).ok_or(HpackError::Truncated)?;
        let raw = self.bytes.get(self.at..end).ok_or(HpackError::Truncated)?;
        self.at = end;
        if huffman {
            huffman_decode(raw)
        } else {
            Ok(raw.to_vec())
        }
    }
}

/// The decoding state of one connection's request headers: the dynamic table.
pub struct Decoder {
    /// Newest first.
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    table_size: usize,
    max_table_size: usize,
    /// The most the peer may set the table size to (what the server advertised).
    allowed_table_size: usize,
}

impl Decoder {
    pub fn new(allowed_table_size: usize) -> Self {
        Self {
            table: VecDeque::new(),
            table_size: 0,
            max_table_size: allowed_table_size,
            allowed_table_size,
        }
    }

    /// Decodes `block`, handing each header to `on_header` in order.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut on_header: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut input = Input {
            bytes: block,
            at: 0,
        };
        let mut fields = 0usize;
        while let Some(first) = input.peek() {
            if first & 0x80 != 0 {
                let index = input.integer(7)?;
                let (name, value) = self.entry(index)?;
                on_header(name, value);
            } else if first & 0x40 != 0 {
                let (name, value) = self.literal(&mut input, 6)?;
                on_header(&name, &value);
                self.insert(name, value);
            } else if first & 0x20 != 0 {
                if fields > 0 {
                    return Err(HpackError::LateSizeUpdate);
                }
                let size = input.integer(5)?;
                if size > self.allowed_table_size {
                    return Err(HpackError::TableTooLarge(size, self.allowed_table_size));
                }
                self.max_table_size = size;
                self.evict_to(size);
                continue;
            } else {
                // Without indexing (0000) or never indexed (0001): the same to a decoder.
                let (name, value) = self.literal(&mut input, 4)?;
                on_header(&name, &value);
            }
            fields += 1;
        }
        Ok(())
    }

    /// A literal field whose name is indexed (`prefix` bits) or follows as a string.
    fn literal(&self, input: &mut Input<'_>, prefix: u8) -> Result<(Vec<u8>, Vec<u8>), HpackError> {
        let index = input.integer(prefix)?;
        let name = if index == 0 {
            input.string()?
        } else {
            self.entry(index)?.0.to_vec()
        };
        Ok((name, input.string()?))
    }

    /// Entry `index` of the static table (1 to 61), then of the dynamic one.
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            0 => Err(HpackError::BadIndex(0)),
            1..=61 => Ok(STATIC_TABLE[index - 1]),
            _ => self
                .table
                .get(index - 62)
                .map(|(name, value)| (name.as_slice(), value.as_slice()))
                .ok_or(HpackError::BadIndex(index)),
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max_table_size {
            // Larger than the table: it empties the table and is not kept (section 4.4).
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_table_size - size);
        self.table_size += size;
        self.table.push_front((name, value));
    }

    fn evict_to(&mut self, size: usize) {
        while self.table_size > size {
            let Some((name, value)) = self.table.pop_back() else {
                break;
            };
            self.table_size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decode(decoder: &mut Decoder, block: &str) -> Vec<(String, String)> {
        let mut headers = Vec::new();
        decoder
            .decode(&hex(block), |n, v| {
                headers.push((
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                ))
            })
            .unwrap();
        headers
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_byte_value_decodes_from_its_huffman_code() {
        // Bytes 0 to 255 in order, Huffman-coded by an independent HPACK implementation.
        let coded = hex(concat!(
            "ffc7fffd8fffffe2fffffe3fffffe4fffffe5fffffe6fffffe7fffffe8ffffeafffffff3fffffa7f",
            "ffffabffffffdfffffebfffffecfffffedfffffeefffffefffffff0ffffff1ffffff2fffffffbfff",
            "ffcffffffd3fffffd7fffffdbfffffdffffffe3fffffe7fffffebfffffed4fe3f9ffaffcabf1febf",
            "afefe7fdfd2cbb00089969b71d79fb9f7fff20ffbff3ff50ddbd7f061c58f265cd9f469d5af66ddd",
            "bf871e5f9cff7ff7fffc3ff9ffe45fff4719242cb34e6e9d68a6a3d7dac426defe3cfaf7fffbfe7f",
            "fbffdffffffcfffe6ffff4bfff9ffffa3fffd3ffff53fffd5ffffb3fffeb7fffdaffffb7ffff73ff",
            "feeffffdeffffebffffbfffffd9ffffdbfffebffffe0ffffeeffffc3ffff8bffff1ffffe4fffee7f",
            "ffb1ffff97fffd9ffffcdffff9fffffbffffdafffeeffff4ffffb7fffee7fffe8ffffd3fffdeffff",
            "d5fffeeffffbdffffe1fffdfffff7fffff5ffffecffff07fff87fffe0ffff17fffedffff87ffff77",
            "fffeffffeaffff8bfffe3ffff93ffff87fffcbffff37ffff1fffff83ffffe1fffebfffe3ffff3fff",
            "ff2ffffa3ffffd9fffff17ffffc7fffff27ffffdefffffbffffff2fffff8fffffb7fff97fff8ffff",
            "fe6fffffc1fffff87ffffe7fffffc5ffffe5fffe4ffff2fffffd1fffff4ffffffefffffe3fffffc9",
            "fffff97fffb3ffffcffffb7fffcdffff4ffff9ffffd1ffffcffffeaffffafffffddffffeffffff4f",
            "ffff5fffffabffffa7ffffd7fffff9bffffecfffffb7fffff3fffffe8fffffd3fffffabfffff5fff",
            "ffff7ffffecfffffdbfffffbbfffff7ffffff0fffffbbf",
        ));
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&coded).unwrap(), all);
    }

    #[test]
    fn bad_huffman_padding_and_end_of_string_are_refused() {
        // "www.example.com" (RFC 7541 C.4.1).
        let good = hex("f1e3c2e5f23a6ba0ab90f4ff");
        assert_eq!(huffman_decode(&good).unwrap(), b"www.example.com");
        // "a" (00011) and padding that is not all ones, or longer than seven bits.
        assert_eq!(huffman_decode(&[0b0001_1111]).unwrap(), b"a");
        assert_eq!(huffman_decode(&[0b0001_1101]), Err(HpackError::Huffman));
        assert_eq!(
            huffman_decode(&[0b0001_1111, 0xff]),
            Err(HpackError::Huffman)
        );
        // End-of-string (thirty ones) inside the string.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xfc]),
            Err(HpackError::Huffman)
        );
    }

    #[test]
    fn rfc_7541_requests_with_huffman_and_the_dynamic_table() {
        let mut decoder = Decoder::new(4096);
        let base = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(
            decode(&mut decoder, "828684418cf1e3c2e5f23a6ba0ab90f4ff"),
            pairs(&base)
        );
        let mut second = base.to_vec();
        second.push(("cache-control", "no-cache"));
        assert_eq!(
            decode(&mut decoder, "828684be5886a8eb10649cbf"),
            pairs(&second)
        );
        assert_eq!(
            decode(
                &mut decoder,
                "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"
            ),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
    }

    #[test]
    fn an_old_grpc_go_client_sends_the_socket_path_as_authority() {
        // Two requests on one connection, encoded by an independent HPACK implementation;
        // the second refers to entries the first added.
        let mut decoder = Decoder::new(4096);
        let first = decode(
            &mut decoder,
            concat!(
                "8386449962cb6a49a92afdc2bedb6a49a92ee2d9dcc42b1c4b620c7abf418f62cb6a60961ad4",
                "304b0d6a1741c9d75f8b1d75d0620d263d4c4d65647a8a9acac8b4c7602bb605c34082497f86",
                "4d833505b11f"
            ),
        );
        let wanted = |path: &str| {
            pairs(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "/run/crius/crius.sock"),
                ("content-type", "application/grpc"),
                ("user-agent", "grpc-go/1.50.1"),
                ("te", "trailers"),
            ])
        };
        assert_eq!(first, wanted("/runtime.v1.RuntimeService/Version"));
        let second = decode(
            &mut decoder,
            "8386449862cb6a49a92afdc2bedb6a49a92ee2d9dcc42b1b9234da8fc2c1c0bf",
        );
        assert_eq!(second, wanted("/runtime.v1.RuntimeService/Status"));
    }

    #[test]
    fn table_sizes_indices_and_truncation_are_checked() {
        let mut decoder = Decoder::new(4096);
        // A size update over what the server allows.
        assert_eq!(
            decoder.decode(&[0x3f, 0xe2, 0x1f], |_, _| {}),
            Err(HpackError::TableTooLarge(4097, 4096))
        );
        // A size update after a field.
        assert_eq!(
            decoder.decode(&[0x82, 0x20], |_, _| {}),
            Err(HpackError::LateSizeUpdate)
        );
        // Index 0 and an index past both tables.
        assert_eq!(
            decoder.decode(&[0x80], |_, _| {}),
            Err(HpackError::BadIndex(0))
        );
        assert_eq!(
            decoder.decode(&[0xbe], |_, _| {}),
            Err(HpackError::BadIndex(62))
        );
        // A string longer than the block, and an endless integer.
        assert_eq!(
            decoder.decode(&[0x04, 0x05, b'a'], |_, _| {}),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            decoder.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff], |_, _| {}),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn entries_are_evicted_oldest_first_within_the_table_size() {
        let mut decoder = Decoder::new(4096);
        // Shrink to room for one 34-byte entry ("a: b" costs 1 + 1 + 32).
        decoder.decode(&[0x20 | 0x1f, 0x03], |_, _| {}).unwrap();
        let literal = |name: u8| [0x40, 0x01, name, 0x01, b'v'];
        decoder.decode(&literal(b'a'), |_, _| {}).unwrap();
        decoder.decode(&literal(b'b'), |_, _| {}).unwrap();
        let mut seen = Vec::new();
        decoder
            .decode(&[0xbe], |n, _| seen.push(n.to_vec()))
            .unwrap();
        assert_eq!(seen, vec![b"b".to_vec()]);
        assert_eq!(
            decoder.decode(&[0xbf], |_, _| {}),
            Err(HpackError::BadIndex(63))
        );
    }

    #[test]
    fn integers_round_trip() {
        for value in [0, 1, 30, 31, 127, 128, 1337, 1 << 20] {
            let mut out = Vec::new();
            encode_integer(value, 5, 0, &mut out);
            let mut input = Input { bytes: &out, at: 0 };
            assert_eq!(input.integer(5).unwrap(), value);
            assert_eq!(input.at, out.len());
        }
    }

    proptest::proptest! {
        /// Any bytes decode as an independent HPACK decoder decodes them, or fail in both.
        #[test]
        fn decodes_as_an_independent_decoder_does(
            blocks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 1..4)
        ) {
            let mut ours = Decoder::new(4096);
            let mut theirs = loona_hpack::Decoder::new();
            theirs.set_max_allowed_table_size(4096);
            for block in blocks {
                let mut mine = Vec::new();
                let got = ours.decode(&block, |n, v| mine.push((n.to_vec(), v.to_vec())));
                let other = theirs.decode(&block);
                match (got, other) {
                    (Ok(()), Ok(headers)) => proptest::prop_assert_eq!(mine, headers),
                    (Err(_), Err(_)) => break,
                    // A block that only resizes the table: h2 accepts it as this does.
                    (Ok(()), Err(loona_hpack::decoder::DecoderError::SizeUpdateAtEnd)) => break,
                    // A resize after a field: refused here as h2 refuses it (RFC 7541 4.2).
                    (Err(HpackError::LateSizeUpdate), Ok(_)) => break,
                    (got, other) => proptest::prop_assert!(
                        false,
                        "{block:02x?}: ours {got:?}, theirs {other:?}"
                    ),
                }
            }
        }
    }
}
