//! SPDY/3.1, the multiplexing kubelet and crictl speak to a CRI stream server: the frame
//! codec with its compressed header blocks, and a server-side connection that hands out the
//! streams a client opens. The rest of crius sees only [`SpdyConnection`], [`SpdyStream`]
//! and [`StreamOutput`], so the codec can be replaced without touching the handlers.

mod conn;
mod dictionary;
pub mod frame;

pub use conn::{SpdyConnection, SpdyStream, StreamClosed, StreamOutput};
pub use frame::{Frame, FrameError, Headers, SpdyCodec, header};
