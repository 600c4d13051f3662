//! The zlib dictionary SPDY/3 header blocks are compressed with (SPDY/3 spec, section
//! 2.6.10.1): each of these words with a 32-bit length prefix, then a run of common values.

use std::sync::OnceLock;

const WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
    "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
    "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
    "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
    "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,",
    "publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The dictionary bytes, built once.
pub fn header_dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let mut bytes = Vec::with_capacity(1423);
        for word in WORDS {
            bytes.extend_from_slice(&(word.len() as u32).to_be_bytes());
            bytes.extend_from_slice(word.as_bytes());
        }
        bytes.extend_from_slice(TAIL.as_bytes());
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_the_size_and_adler32_of_the_spdy3_dictionary() {
        let dictionary = header_dictionary();
        assert_eq!(dictionary.len(), 1423);
        assert_eq!(&dictionary[..11], b"\0\0\0\x07options");
        assert!(dictionary.ends_with(b",*,enq=0."));
        // The checksum zlib streams carry to name their preset dictionary.
        let (mut a, mut b) = (1u32, 0u32);
        for byte in dictionary {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }
}
