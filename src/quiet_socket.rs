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
//!
//! The same holds the other way round for the peer: crius's read of a request frees room
//! in the client's send buffer, which wakes a client registered for writability (grpc-go,
//! tokio and grpc-core clients all are) before crius has answered, and on a busy CPU that
//! wake-up runs ahead of crius's answer. So a server's connection ([`QuietUnixStream::server`])
//! peeks at what the client sent and takes it off the socket only after its next write: the
//! client is awake for the answer by then, and the room it gets back costs it no second
//! wake-up (perf: 1.3 context switches of crius per request instead of 2.4).

use std::future::Future;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// The most bytes a server connection leaves on its socket after reading them (a polled
/// read's request is a few hundred).
const DEFER_LIMIT: usize = 16 * 1024;
/// How long bytes stay on the socket at most once a read finds nothing more: they count
/// against the client's send buffer (by the kernel's bookkeeping of each write, not their
/// size), so a client that sends a request in many small writes could fill it before crius
/// has the whole request, and then neither side would move.
const DEFER_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(2);

pub struct QuietUnixStream {
    socket: AsyncFd<UnixStream>,
    /// A duplicate of the socket registered for writability while a write waits for room.
    write_waiter: Option<AsyncFd<OwnedFd>>,
    /// Nothing read yet: the first read tries the socket before waiting for an edge (a new
    /// connection's first bytes are usually there already).
    fresh: bool,
    /// Bytes handed to the reader but left in the socket until the next write (see
    /// [`QuietUnixStream::server`]); `None` when reads take the bytes at once.
    deferred: Option<usize>,
    /// Takes the deferred bytes off [`DEFER_TIMEOUT`] after a read found nothing more.
    take_off_timer: Option<Pin<Box<tokio::time::Sleep>>>,
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
            deferred: None,
            take_off_timer: None,
        })
    }

    /// A server's connection: what the client sends is read with peeks (the kernel's peek
    /// offset moves past what was read) and taken off the socket by the next write, before
    /// a read once [`DEFER_LIMIT`] bytes wait, [`DEFER_TIMEOUT`] after a read found nothing
    /// more, and when the connection ends. Out-of-band bytes stay in line, so peeks and
    /// reads count the same bytes. Without `SO_PEEK_OFF` reads take the bytes at once.
    pub fn server(stream: tokio::net::UnixStream) -> io::Result<Self> {
        let mut quiet = Self::new(stream)?;
        let socket = quiet.socket.get_ref();
        if set_int_option(socket, libc::SO_OOBINLINE, 1).is_ok()
            && set_int_option(socket, libc::SO_PEEK_OFF, 0).is_ok()
        {
            quiet.deferred = Some(0);
        }
        Ok(quiet)
    }

    /// Takes the bytes already handed to the reader off the socket.
    fn take_off_deferred(&mut self) {
        self.take_off_timer = None;
        if let Some(deferred) = self.deferred.as_mut() {
            // A failure leaves them counted; the next read or write finds the socket's error.
            let _ = take_off(self.socket.get_ref(), deferred);
        }
    }

    /// A read found nothing more: bytes it left on the socket go at the latest
    /// [`DEFER_TIMEOUT`] from now, unless a write takes them first.
    fn take_off_later(&mut self, cx: &mut Context<'_>) {
        if self.deferred.is_none_or(|n| n == 0) {
            self.take_off_timer = None;
            return;
        }
        let timer = self
            .take_off_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(DEFER_TIMEOUT)));
        if timer.as_mut().poll(cx).is_ready() {
            self.take_off_deferred();
        }
    }

    /// Runs a write until it goes through or fails, waiting for room when the socket has
    /// none.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&UnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let written = write(self.socket.get_ref());
            self.take_off_deferred();
            match written {
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
            match read_once(this.socket.get_ref(), &mut this.deferred, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done.map(|_| ())),
            }
        }
        loop {
            let mut ready = match this.socket.poll_read_ready(cx) {
                Poll::Ready(ready) => ready?,
                Poll::Pending => {
                    this.take_off_later(cx);
                    return Poll::Pending;
                }
            };
            let wanted = buf.remaining();
            match ready.try_io(|socket| read_once(socket.get_ref(), &mut this.deferred, buf)) {
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

/// One read: a peek when reads are deferred (the kernel's peek offset moves past what was
/// handed out), else a read.
fn read_once(
    socket: &UnixStream,
    deferred: &mut Option<usize>,
    buf: &mut ReadBuf<'_>,
) -> io::Result<usize> {
    let Some(deferred) = deferred.as_mut() else {
        return read_into(socket, buf, 0);
    };
    if *deferred >= DEFER_LIMIT {
        take_off(socket, deferred)?;
    }
    let n = read_into(socket, buf, libc::MSG_PEEK)?;
    *deferred += n;
    Ok(n)
}

/// Takes `deferred` bytes, already handed to the reader, off the socket.
fn take_off(socket: &UnixStream, deferred: &mut usize) -> io::Result<()> {
    let mut scratch = [0u8; 4096];
    while *deferred > 0 {
        let want = (*deferred).min(scratch.len());
        // SAFETY: `scratch` is valid for `want` bytes.
        let n = unsafe { libc::recv(socket.as_raw_fd(), scratch.as_mut_ptr().cast(), want, 0) };
        match usize::try_from(n) {
            // The peer went away: nothing is left to take.
            Ok(0) => *deferred = 0,
            Ok(n) => *deferred -= n.min(*deferred),
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Sets an integer socket option: `SO_PEEK_OFF` makes peeks move past what earlier peeks
/// returned, `SO_OOBINLINE` keeps out-of-band bytes in the stream.
fn set_int_option(socket: &UnixStream, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain integer option on a socket this process owns.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One `recv` with `flags` into the unfilled part of `buf` (not zeroed first), which it then
/// fills.
fn read_into(socket: &UnixStream, buf: &mut ReadBuf<'_>, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the kernel only writes to the unfilled part, and the bytes it reports written
    // are then marked initialized and filled.
    unsafe {
        let unfilled = buf.unfilled_mut();
        let n = libc::recv(
            socket.as_raw_fd(),
            unfilled.as_mut_ptr().cast(),
            unfilled.len(),
            flags,
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
        let this = self.get_mut();
        this.take_off_deferred();
        Poll::Ready(this.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

impl Drop for QuietUnixStream {
    /// Bytes left on a socket when it closes make the client's next read fail with
    /// `ECONNRESET` instead of seeing the end.
    fn drop(&mut self) {
        self.take_off_deferred();
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

    fn server_pair() -> (QuietUnixStream, tokio::net::UnixStream) {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("socket pair");
        let quiet = QuietUnixStream::server(ours).expect("quiet");
        assert!(quiet.deferred.is_some(), "SO_PEEK_OFF refused");
        (quiet, theirs)
    }

    /// Bytes waiting in the socket's receive queue.
    fn queued(quiet: &QuietUnixStream) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let rc = unsafe { libc::ioctl(quiet.socket.get_ref().as_raw_fd(), libc::FIONREAD, &mut n) };
        assert_eq!(rc, 0, "FIONREAD: {}", io::Error::last_os_error());
        usize::try_from(n).expect("a count")
    }

    #[tokio::test]
    async fn a_server_takes_a_request_off_the_socket_once_it_has_answered() {
        let (mut quiet, mut peer) = server_pair();
        peer.write_all(b"request").await.expect("write");
        let mut buf = [0u8; 7];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"request");
        assert_eq!(queued(&quiet), 7, "read, and still on the socket");
        peer.write_all(b"more").await.expect("write");
        let mut buf = [0u8; 4];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"more", "a second read goes on after the first");
        assert_eq!(queued(&quiet), 11);
        quiet.write_all(b"answer").await.expect("write");
        assert_eq!(queued(&quiet), 0, "taken off by the answer");
        let mut buf = [0u8; 6];
        peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"answer");
        // What comes after is read as before.
        peer.write_all(b"next").await.expect("write");
        let mut buf = [0u8; 4];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"next");
    }

    #[tokio::test]
    async fn a_server_that_does_not_answer_leaves_at_most_the_limit_on_the_socket() {
        let (mut quiet, mut peer) = server_pair();
        let sent: Vec<u8> = (0..40 * 1024).map(|i| (i % 251) as u8).collect();
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                peer.write_all(&sent).await.expect("write");
                peer
            })
        };
        let mut received = Vec::new();
        let mut chunk = [0u8; 1024];
        let mut most_left = 0;
        while received.len() < sent.len() {
            let n = quiet.read(&mut chunk).await.expect("read");
            assert_ne!(n, 0, "ended early");
            received.extend_from_slice(&chunk[..n]);
            // Queued: what was read and left, and what is not read yet.
            let left = queued(&quiet) - (sent.len() - received.len());
            assert!(
                left <= DEFER_LIMIT + chunk.len(),
                "{left} bytes read and left"
            );
            most_left = most_left.max(left);
        }
        assert!(most_left >= DEFER_LIMIT, "only {most_left} bytes were left");
        assert_eq!(received, sent, "every byte once, in order");
        drop(writer.await.expect("writer"));
    }

    #[tokio::test]
    async fn a_server_that_waits_for_more_takes_what_it_read_off_soon() {
        let (mut quiet, mut peer) = server_pair();
        peer.write_all(b"part of a request").await.expect("write");
        let mut buf = [0u8; 17];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(queued(&quiet), 17);
        // Waiting for the rest of the request, with nothing to write meanwhile.
        let waited = tokio::time::timeout(DEFER_TIMEOUT * 10, quiet.read(&mut [0u8; 8])).await;
        assert!(waited.is_err(), "nothing more was sent");
        assert_eq!(queued(&quiet), 0, "left on the client's account");
        peer.write_all(b"rest").await.expect("write");
        let mut buf = [0u8; 4];
        quiet.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"rest", "what follows is read once, in order");
    }

    #[tokio::test]
    async fn a_server_that_hangs_up_leaves_the_client_the_end_not_a_reset() {
        let (mut quiet, mut peer) = server_pair();
        peer.write_all(b"request").await.expect("write");
        let mut buf = [0u8; 7];
        quiet.read_exact(&mut buf).await.expect("read");
        drop(quiet);
        let mut rest = Vec::new();
        let read = peer.read_to_end(&mut rest).await;
        assert_eq!(read.expect("the end, not ECONNRESET"), 0);
    }

    #[tokio::test]
    async fn out_of_band_bytes_stay_in_the_stream() {
        let (mut quiet, mut peer) = server_pair();
        peer.write_all(b"ab").await.expect("write");
        // SAFETY: one byte from a live buffer on a socket this test owns.
        let sent = unsafe { libc::send(peer.as_raw_fd(), b"c".as_ptr().cast(), 1, libc::MSG_OOB) };
        assert_eq!(sent, 1, "MSG_OOB: {}", io::Error::last_os_error());
        peer.write_all(b"de").await.expect("write");
        drop(peer);
        let mut received = Vec::new();
        let mut chunk = [0u8; 2];
        loop {
            let n = quiet.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..n]);
            quiet.write_all(b"x").await.ok();
        }
        assert_eq!(received, b"abcde", "every byte once, in order");
    }

    #[tokio::test]
    async fn a_server_reads_what_a_client_sent_before_it_went_away() {
        let (mut quiet, mut peer) = server_pair();
        peer.write_all(b"last words").await.expect("write");
        drop(peer);
        let mut received = Vec::new();
        quiet.read_to_end(&mut received).await.expect("read");
        assert_eq!(received, b"last words");
        quiet.shutdown().await.expect("shutdown");
        assert_eq!(queued(&quiet), 0, "taken off by the shutdown");
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
