//! Client input on its way to a process or a pod's port, bounded in bytes.
//!
//! What a client sends on a stream waits here until the process (or the pod's socket) takes
//! it. Each stream may hold at most its own limit, and all streams of one connection
//! together at most the connection's; a sender that would pass either waits, which stops the
//! connection's reader and so pushes back on the client through TCP. Messages are counted
//! by their bytes, a small one as [`MIN_CHARGE`] bytes (what it costs to keep, so a flood of
//! one-byte frames cannot queue a hundred times the budget), and every chunk is copied out
//! of the reader's buffer so a small chunk never pins a large buffer. When the receiving
//! side is dropped, sends fail at once: what nobody reads is refused, not queued.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Input queued for one stream at most.
pub const STREAM_INPUT_LIMIT: usize = 256 * 1024;
/// Input queued for all streams of one connection at most.
pub const CONNECTION_INPUT_LIMIT: usize = 1024 * 1024;
/// Input is queued in pieces of at most this size.
const PIECE: usize = 32 * 1024;
/// What a piece costs of the budgets at least: its allocation and queue slot.
const MIN_CHARGE: usize = 256;

/// The receiving side has gone: nobody reads this stream.
#[derive(Debug, thiserror::Error)]
#[error("nobody reads this stream any more")]
pub struct InputClosed;

/// The byte budget all streams of one connection share.
#[derive(Clone)]
pub struct ConnectionBudget {
    bytes: Arc<Semaphore>,
}

impl ConnectionBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(limit)),
        }
    }

    /// Bytes queued on the connection's streams now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// A new stream's queue, holding at most `limit` bytes of this budget.
    pub fn stream(&self, limit: usize) -> (InputSender, Input) {
        let (tx, rx) = mpsc::unbounded_channel();
        let piece = PIECE.min(limit).max(1);
        (
            InputSender {
                tx,
                stream: Arc::new(Semaphore::new(limit.max(piece))),
                connection: self.bytes.clone(),
                piece,
            },
            Input { rx },
        )
    }
}

impl Default for ConnectionBudget {
    fn default() -> Self {
        Self::new(CONNECTION_INPUT_LIMIT)
    }
}

/// One queued piece and the budget it holds until it is read.
struct Piece {
    data: Bytes,
    _stream: OwnedSemaphorePermit,
    _connection: OwnedSemaphorePermit,
}

/// Queues a stream's input. Cheap to clone.
#[derive(Clone)]
pub struct InputSender {
    tx: mpsc::UnboundedSender<Piece>,
    stream: Arc<Semaphore>,
    connection: Arc<Semaphore>,
    piece: usize,
}

impl InputSender {
    /// Queues `data`, waiting while the stream or its connection holds all it may.
    pub async fn send(&self, data: Bytes) -> Result<(), InputClosed> {
        for chunk in data.chunks(self.piece) {
            let piece = tokio::select! {
                piece = self.reserve(chunk) => piece?,
                _ = self.tx.closed() => return Err(InputClosed),
            };
            self.tx.send(piece).map_err(|_| InputClosed)?;
        }
        Ok(())
    }

    async fn reserve(&self, chunk: &[u8]) -> Result<Piece, InputClosed> {
        let charge = chunk.len().max(MIN_CHARGE.min(self.piece));
        let n = u32::try_from(charge).map_err(|_| InputClosed)?;
        let stream = self
            .stream
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| InputClosed)?;
        let connection = self
            .connection
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| InputClosed)?;
        Ok(Piece {
            data: Bytes::copy_from_slice(chunk),
            _stream: stream,
            _connection: connection,
        })
    }

    /// Whether the receiving side has gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// A stream's input as the process side reads it; ends when the client ends the stream.
pub struct Input {
    rx: mpsc::UnboundedReceiver<Piece>,
}

impl Input {
    /// The next piece of input; `None` once the stream's input has ended.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await.map(|piece| piece.data)
    }

    /// An input that has already ended.
    pub fn ended() -> Self {
        let (_, rx) = mpsc::unbounded_channel();
        Self { rx }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_stream_holds_no_more_than_its_limit_until_it_is_read() {
        let budget = ConnectionBudget::new(1 << 20);
        let (tx, mut rx) = budget.stream(64 * 1024);
        tx.send(Bytes::from(vec![1u8; 64 * 1024])).await.unwrap();
        let blocked = tokio::time::timeout(
            Duration::from_millis(100),
            tx.send(Bytes::from_static(b"x")),
        );
        assert!(blocked.await.is_err(), "a full stream took more");
        assert_eq!(budget.available(), (1 << 20) - 64 * 1024);
        let mut read = 0;
        while read < 64 * 1024 {
            read += rx.recv().await.unwrap().len();
        }
        assert_eq!(budget.available(), 1 << 20, "reading gave the budget back");
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"x"));
    }

    #[tokio::test]
    async fn streams_of_a_connection_share_its_limit() {
        let budget = ConnectionBudget::new(100 * 1024);
        let (first, first_rx) = budget.stream(64 * 1024);
        let (second, mut second_rx) = budget.stream(64 * 1024);
        first.send(Bytes::from(vec![0u8; 64 * 1024])).await.unwrap();
        let over = tokio::time::timeout(
            Duration::from_millis(100),
            second.send(Bytes::from(vec![0u8; 64 * 1024])),
        );
        assert!(over.await.is_err(), "the connection's limit was passed");
        // What the first stream held goes back to the connection when it is dropped.
        drop(first_rx);
        second
            .send(Bytes::from(vec![0u8; 32 * 1024]))
            .await
            .unwrap();
        assert_eq!(second_rx.recv().await.unwrap().len(), 32 * 1024);
    }

    #[tokio::test]
    async fn input_nobody_reads_is_refused_and_gives_its_budget_back() {
        let budget = ConnectionBudget::new(1 << 20);
        let (tx, rx) = budget.stream(64 * 1024);
        tx.send(Bytes::from(vec![0u8; 1000])).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(Bytes::from(vec![0u8; 64 * 1024])).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(rx);
        assert!(waiting.await.unwrap().is_err(), "a waiting send ends");
        assert!(tx.send(Bytes::from_static(b"x")).await.is_err());
        assert!(tx.is_closed());
        assert_eq!(budget.available(), 1 << 20);
    }

    #[tokio::test]
    async fn tiny_messages_are_charged_what_they_cost_to_keep() {
        let budget = ConnectionBudget::new(1 << 20);
        let (tx, mut rx) = budget.stream(STREAM_INPUT_LIMIT);
        let fits = STREAM_INPUT_LIMIT / MIN_CHARGE;
        for _ in 0..fits {
            tx.send(Bytes::from_static(b"x")).await.unwrap();
        }
        let blocked = tokio::time::timeout(
            Duration::from_millis(100),
            tx.send(Bytes::from_static(b"x")),
        );
        assert!(
            blocked.await.is_err(),
            "one-byte messages queued past the limit"
        );
        assert_eq!(budget.available(), (1 << 20) - STREAM_INPUT_LIMIT);
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"x"));
        assert_eq!(
            budget.available(),
            (1 << 20) - STREAM_INPUT_LIMIT + MIN_CHARGE
        );
    }

    #[tokio::test]
    async fn big_messages_arrive_whole_in_pieces() {
        let budget = ConnectionBudget::default();
        let (tx, mut rx) = budget.stream(STREAM_INPUT_LIMIT);
        let message: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let sent = message.clone();
        let sender = tokio::spawn(async move { tx.send(Bytes::from(sent)).await });
        let mut got = Vec::new();
        while let Some(piece) = rx.recv().await {
            assert!(piece.len() <= PIECE);
            got.extend_from_slice(&piece);
        }
        sender.await.unwrap().unwrap();
        assert_eq!(got, message);
    }
}
