//! A unix socket connection that wakes crius only when the peer sent something: the CRI
//! clients' connections and crius's own to containerd.
//!
//! tokio registers a socket for reading and writing at once, edge-triggered. On a unix
//! socket every read by the peer frees room in crius's send buffer, so after each message
//! the peer's read of it woke a crius worker for nothing (strace: an `EPOLLOUT` after
//! every `writev`), and the peer's `recvfrom` paid for that wake-up. Here the socket is
//! registered for reading only; writes go straight to the socket, and only a write that
//! finds the buffer full registers a second descriptor of it for writability, until the
//! write goes through.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

pub struct QuietUnixStream {
    socket: AsyncFd<UnixStream>,
    /// A duplicate of the socket registered for writability while a write waits for room.
    write_waiter: Option<AsyncFd<OwnedFd>>,
    /// Nothing read yet: the first read tries the socket before waiting for an edge (a new
    /// connection's first bytes are usually there already).
    fresh: bool,
}

impl QuietUnixStream {
    /// Takes over a connection (non-blocking, as tokio made it).
    pub fn new(stream: tokio::net::UnixStream) -> io::Result<Self> {
        let socket = stream.into_std()?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket: register(socket, Interest::READABLE)?,
            write_waiter: None,
            fresh: true,
        })
    }

    /// Runs a write until it goes through or fails, waiting for room when the socket has
    /// none.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&UnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match write(self.socket.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => {
                    // Room again: no more wake-ups for writability.
                    self.write_waiter = None;
                    return Poll::Ready(done);
                }
            }
            let waiter = match &mut self.write_waiter {
                Some(waiter) => waiter,
                None => {
                    let duplicate = self.socket.get_ref().as_fd().try_clone_to_owned()?;
                    self.write_waiter
                        .insert(register(duplicate, Interest::WRITABLE)?)
                }
            };
            let mut ready = ready!(waiter.poll_write_ready(cx))?;
            // The next write attempt decides; a new edge wakes this task again.
            ready.clear_ready();
        }
    }
}

/// Registers an owned descriptor with the reactor for `interest` only.
fn register<T: AsRawFd + Into<OwnedFd>>(io: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `T` owns its descriptor (it converts into an OwnedFd): it stays open, the same
    // descriptor, for as long as the AsyncFd holds it.
    unsafe { AsyncFd::register_with_interest(io, interest) }.map_err(io::Error::from)
}

impl AsyncRead for QuietUnixStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.fresh) {
            match read_into(this.socket.get_ref(), buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done.map(|_| ())),
            }
        }
        loop {
            let mut ready = ready!(this.socket.poll_read_ready(cx))?;
            let wanted = buf.remaining();
            match ready.try_io(|socket| read_into(socket.get_ref(), buf)) {
                Ok(Ok(n)) => {
                    // A short read emptied the socket: wait for the next edge rather than
                    // find out with another read (as tokio's own sockets do).
                    if n > 0 && n < wanted {
                        ready.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// One `read` into the unfilled part of `buf` (not zeroed first), which it then fills.
fn read_into(socket: &UnixStream, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // SAFETY: the kernel only writes to the unfilled part, and the bytes it reports written
    // are then marked initialized and filled.
    unsafe {
        let unfilled = buf.unfilled_mut();
        let n = libc::read(
            socket.as_raw_fd(),
            unfilled.as_mut_ptr().cast(),
            unfilled.len(),
        );
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        buf.assume_init(n);
        buf.advance(n);
        Ok(n)
    }
}

impl AsyncWrite for QuietUnixStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut socket| socket.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut socket| socket.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

impl tonic::transport::server::Connected for QuietUnixStream {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair() -> (QuietUnixStream, tokio::net::UnixStream) {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("socket pair");
        (QuietUnixStream::new(ours).expect("quiet"), theirs)
    }

    /// The events `fd` is registered for in any epoll instance of this process.
    fn epoll_events(fd: i32) -> Option<u32> {
        for entry in std::fs::read_dir("/proc/self/fdinfo").ok()? {
            let Ok(text) = std::fs::read_to_string(entry.ok()?.path()) else {
                continue;
            };
            for line in text.lines() {
                let words: Vec<&str> = line.split_whitespace().collect();
                if let ["tfd:", tfd, "events:", events, ..] = words.as_slice()
                    && tfd.parse() == Ok(fd)
                {
                    return u32::from_str_radix(events, 16).ok();
                }
            }
        }
        None
    }

    #[tokio::test]
    async fn the_socket_is_registered_for_reading_only_until_a_write_waits() {
        let (mut quiet, peer) = pair();
        let ours = epoll_events(quiet.socket.get_ref().as_raw_fd()).expect("registered");
        assert_ne!(ours & libc::EPOLLIN as u32, 0, "{ours:x}");
        assert_eq!(ours & libc::EPOLLOUT as u32, 0, "{ours:x}");
        // What tokio's own socket asks for, and this one does not.
        let theirs = epoll_events(peer.as_raw_fd()).expect("registered");
        assert_ne!(theirs & libc::EPOLLOUT as u32, 0, "{theirs:x}");
        // A write that finds no room waits on a duplicate registered for writing only.
        let big = vec![0u8; 8 << 20];
        let write = quiet.write_all(&big);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), write)
                .await
                .is_err(),
            "an 8 MiB write fit in the socket"
        );
        let waiter = quiet.write_waiter.as_ref().expect("a write waiter");
        let waiting = epoll_events(waiter.get_ref().as_raw_fd()).expect("registered");
        assert_ne!(waiting & libc::EPOLLOUT as u32, 0, "{waiting:x}");
        assert_eq!(waiting & libc::EPOLLIN as u32, 0, "{waiting:x}");
    }

    #[tokio::test]
    async fn reads_and_writes_go_through() {
        let (mut quiet, mut peer) = pair();
        peer.write_all(b"request").await.expect("write");
        let mut buf = [0u8; 7];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"request");
        quiet.write_all(b"answer").await.expect("write");
        let mut buf = [0u8; 6];
        peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"answer");
        quiet.shutdown().await.expect("shutdown");
        assert_eq!(peer.read(&mut buf).await.expect("end"), 0);
        drop(peer);
        assert_eq!(quiet.read(&mut buf).await.expect("end"), 0);
    }

    #[tokio::test]
    async fn a_write_waiting_for_room_ends_when_the_peer_goes_away() {
        let (mut quiet, peer) = pair();
        let writer = tokio::spawn(async move { quiet.write_all(&vec![1u8; 8 << 20]).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(peer);
        let written = tokio::time::timeout(std::time::Duration::from_secs(10), writer)
            .await
            .expect("the blocked write was woken by the hang-up")
            .expect("writer");
        let err = written.expect_err("a write to a closed peer");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    }

    #[tokio::test]
    async fn a_write_larger_than_the_socket_buffer_waits_for_the_peer_to_read() {
        let (mut quiet, mut peer) = pair();
        let big = vec![7u8; 8 * 1024 * 1024];
        let expected = big.len();
        let writer = tokio::spawn(async move {
            quiet.write_all(&big).await.expect("write everything");
            quiet
        });
        // Let the writer fill the buffer and wait before anything is read.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut received = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        while received.len() < expected {
            let n = peer.read(&mut chunk).await.expect("read");
            assert_ne!(n, 0, "the writer stopped early");
            received.extend_from_slice(&chunk[..n]);
        }
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(10), writer)
            .await
            .expect("the blocked write was woken when room came back")
            .expect("writer");
        assert!(received.iter().all(|b| *b == 7));
        assert!(
            quiet.write_waiter.is_none(),
            "the waiter is gone once written"
        );
    }
}
